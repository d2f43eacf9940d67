"""onnxruntime's fused ops where a traced graph has their pattern, rewritten with onnxscript's
pattern rewriter (the library of torch's exporter and of onnxruntime's own transformer fusions).

- A residual ``Add`` whose sum is normalized by ``RMSNormalization`` (every pre-norm block: the
  sum goes on as the next residual) becomes one ``SkipSimplifiedLayerNormalization``
  (``com.microsoft``), which gives both the normalized sum and the sum. onnxscript's own rule
  (``ort_fusions.skip_normalization``) matches ORT's ``SimplifiedLayerNormalization``; the
  exporter writes ONNX's ``RMSNormalization`` (opset 23), hence this rule.

An int4 decoding step of a small model runs hundreds of tiny ops, each costing onnxruntime a
few microseconds to dispatch whatever its size; each fusion here removes one op per norm.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import _fusion_utils, pattern

MICROSOFT = "com.microsoft"


class SkipRmsNormalization(pattern.RewriteRuleClassBase):
    """Add(input, skip) -> RMSNormalization(axis -1, float32 statistics) as one
    SkipSimplifiedLayerNormalization: input, skip (batch, len, d) of one shape, gamma (d,)."""

    def pattern(self, op, input, skip, gamma):
        skip_sum = op.Add(input, skip)
        normalized = op.RMSNormalization(skip_sum, gamma, _allow_other_attributes=True,
                                         _outputs=["rms_norm"])
        return normalized, skip_sum

    def check(self, op, input, skip, gamma, rms_norm, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        bindings: dict[str, int | ir.SymbolicDim] = {}

        def fits(value: ir.Value, dims: Sequence[str]) -> bool:
            return _fusion_utils.check_shape_bool(bindings, value, dims)

        if not (fits(input, ["B", "S", "D"]) and fits(skip, ["B", "S", "D"]) and fits(gamma, ["D"])):
            return result.fail("not (batch, len, d) + (batch, len, d), scaled by (d,)")
        attributes = rms_norm.producer().attributes
        if attributes.get_int("axis", -1) not in (-1, 2) or attributes.get_int("stash_type", 1) != 1:
            return result.fail("not a float32 normalization over the last axis")
        return result

    def rewrite(self, op, input, skip, gamma, rms_norm, **_):
        epsilon = rms_norm.producer().attributes.get_float("epsilon", 1e-5)
        normalized, _mean, _inv_std, skip_sum = op.SkipSimplifiedLayerNormalization(
            input, skip, gamma, epsilon=epsilon, _outputs=4, _domain=MICROSOFT)
        return normalized, skip_sum


_RULES = pattern.RewriteRuleSet([SkipRmsNormalization.rule()])


def fuse_for_onnxruntime(model: ir.Model) -> int:
    """Apply the fusions to ``model`` in place; how many nodes were fused."""
    count = _RULES.apply_to_model(model)
    if count and MICROSOFT not in model.opset_imports:
        model.opset_imports[MICROSOFT] = 1
    return count
