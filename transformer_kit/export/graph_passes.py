"""What every graph goes through once built, before its weights are written (:func:`finish`):
onnxscript's optimizer (constant folding, common subexpressions such as the rotary angles every
layer computes alike, dead nodes), onnxruntime's fused ops where the graph has their pattern, and
module-path names for the nodes those passes made.

onnxruntime's fused ops are rewritten with onnxscript's pattern rewriter (the library of torch's
exporter and of onnxruntime's own transformer fusions):

- A residual ``Add`` whose sum is normalized by ``RMSNormalization`` (every pre-norm block: the
  sum goes on as the next residual) becomes one ``SkipSimplifiedLayerNormalization``
  (``com.microsoft``), which gives both the normalized sum and the sum. onnxscript's own rule
  (``ort_fusions.skip_normalization``) matches ORT's ``SimplifiedLayerNormalization``; the
  lowerings write ONNX's ``RMSNormalization`` (opset 23), hence this rule.

An int4 decoding step of a small model runs hundreds of tiny ops, each costing onnxruntime a
few microseconds to dispatch whatever its size; each fusion here removes one op per norm.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator, Sequence

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


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """torch's exporter and onnxscript's passes print progress and log a warning for every
    weight without a value (all of them, here); silence both."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export",
                                              "onnxscript", "onnx_ir")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def tidy(model: ir.Model) -> None:
    """onnxscript's optimizer (constant folding, never of a weight: they have no value here;
    common subexpressions; dead nodes) and its ONNX fusions."""
    import onnxscript.optimizer
    import onnxscript.rewriter.onnx_fusions

    with quiet_exporter():
        onnxscript.optimizer.optimize_ir(model)
        onnxscript.rewriter.onnx_fusions.fuse(model)


def name_new_nodes(graph: ir.Graph) -> None:
    """Nodes and values the passes made, named like the builder's: a fused node after the module
    path of what it replaced (its output's), ``{path}/{OpType}``; its outputs after it."""
    taken = {node.name for node in graph} | {v.name for node in graph for v in node.outputs}
    taken |= {v.name for v in graph.inputs} | set(graph.initializers)

    def unique(name: str) -> str:
        candidate, i = name, 0
        while candidate in taken:
            i += 1
            candidate = f"{name}_{i}"
        taken.add(candidate)
        return candidate

    for node in graph:
        if node.name and "/" in node.name:
            continue
        paths = [v.name.split("/")[0] for v in node.outputs if v.name and "/" in v.name]
        paths += [v.name.split("/")[0] for v in node.inputs if v is not None and v.name and "/" in v.name]
        if not paths:
            continue
        node.name = unique(f"{paths[0]}/{node.op_type}")
        for i, value in enumerate(node.outputs):
            if value.name is None or ("/" not in value.name and value not in graph.outputs):
                value.name = unique(f"{node.name}/output_{i}")


def finish(model: ir.Model) -> None:
    """Every pass a built graph goes through before its weights are written."""
    tidy(model)
    fuse_for_onnxruntime(model)
    name_new_nodes(model.graph)
