"""Shared by the mixture-of-experts family tests: a random checkpoint written by transformers,
loaded with ``tk.from_hf``, gives transformers' logits in PyTorch on a padded batch and its
greedy tokens; its export (onnxruntime's fused MoE op, one node per sparse layer) verifies and
gives transformers' logits and tokens in onnxruntime; streamed, int8 and int4 exports verify."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np
import onnx
import torch
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity
from transformer_kit.export import export_onnx
from transformer_kit.plugins.mixture_of_experts import MixtureOfExperts


def check_greedy_tokens(reference, model) -> None:
    """Greedy generation in PyTorch equals transformers' ``generate`` on a padded batch."""
    cfg = model.config
    ids, mask = parity.batch(model, size=3, length=6, seed=3)
    gen = hf.GenerationConfig(do_sample=False, max_new_tokens=12, pad_token_id=cfg.pad_id,
                              eos_token_id=cfg.eos_id, bos_token_id=cfg.bos_id)
    order = torch.argsort(mask, dim=1, stable=True)  # transformers wants left padding
    with torch.no_grad():
        out = reference.generate(input_ids=ids.gather(1, order), attention_mask=mask.gather(1, order),
                                 generation_config=gen)
    expected = parity.after_eos(out[:, ids.shape[1]:].numpy(), cfg.eos_ids, cfg.pad_id)
    ours = model.generate(ids, max_new_tokens=12, attention_mask=mask).numpy()
    np.testing.assert_array_equal(ours[:, :expected.shape[1]], expected)
    assert (ours[:, expected.shape[1]:] == cfg.pad_id).all()  # transformers stops sooner
    assert expected.shape[1] >= 3 and len(np.unique(expected)) >= 2, expected  # not one repeated token


class MoeFamilyParity:
    """The tests every mixture-of-experts family passes (``CHECKPOINTS`` as in
    ``parity.FamilyParity``; ``conftest.py`` parametrizes ``checkpoint``)."""

    CHECKPOINTS: ClassVar[dict[str, Callable[[], torch.nn.Module]]] = {}

    def test_logits_equal_transformers_in_pytorch(self, checkpoint):
        reference, model, _ = checkpoint
        parity.check_pytorch(reference, model)

    def test_greedy_tokens_equal_transformers_generate(self, checkpoint):
        reference, model, _ = checkpoint
        check_greedy_tokens(reference, model)

    def test_config_and_weights_survive_save_and_load(self, checkpoint, tmp_path):
        reference, model, folder = checkpoint
        parity.check_save_and_load(reference, model, folder, tmp_path / "saved")

    def test_export_equals_transformers_in_onnxruntime_with_one_moe_node_per_sparse_layer(
            self, checkpoint, tmp_path):
        reference, model, _ = checkpoint
        parity.check_onnxruntime(reference, model, tmp_path / "onnx")
        check_moe_nodes(model, tmp_path / "onnx")

    def test_streamed_int8_and_int4_exports_verify(self, checkpoint, tmp_path):
        """From the checkpoint streamed (each layer's experts read and stacked as written), and
        quantized (int8: the experts as QMoE in 8 bits; int4: QMoE in 4 bits where a block
        divides the experts' widths, else MoE in float32): each export's own verification passes."""
        _, model, folder = checkpoint
        streamed = tk.from_hf(folder, stream=True, pad_id=model.config.pad_id)
        export_onnx(streamed, tmp_path / "streamed")
        check_moe_nodes(model, tmp_path / "streamed")
        for quantize in ("int8", "int4"):
            export_onnx(model, tmp_path / quantize, quantize=quantize)
            check_moe_nodes(model, tmp_path / quantize)


def check_moe_nodes(model, folder) -> None:
    """Each graph of the export in ``folder`` holds one ``com.microsoft`` ``MoE`` (or, quantized,
    ``QMoE``) node per sparse layer of ``model`` and no node of a single expert (no per-expert
    MatMul: the experts' weights reach the graph only stacked, as the node's inputs)."""
    sparse = sum(isinstance(m, MixtureOfExperts) for m in model.modules())
    assert sparse >= 1
    for path in sorted(folder.glob("*.onnx")):
        graph = onnx.load(path, load_external_data=False).graph
        moe = [n for n in graph.node if n.op_type in ("MoE", "QMoE")]
        assert len(moe) == sparse and all(n.domain == "com.microsoft" for n in moe), path.name
        assert not [n.name for n in graph.node if ".experts." in n.name], path.name
        stacked = {n.input[2] for n in moe} | {n.input[4 if n.op_type == "MoE" else 5] for n in moe}
        assert all(".experts." in name for name in stacked), stacked
        for node in graph.node:
            if node.op_type in ("MatMul", "MatMulNBits", "MatMulInteger"):
                assert not any(".experts." in name for name in node.input), (path.name, node.name)


def spread_gpt_oss(model: torch.nn.Module, also: tuple[str, ...] = (), head_std: float | None = None,
                   ) -> torch.nn.Module:
    """A transformers gpt-oss ``model`` with expert weights large enough that the clamp at
    swiglu_limit acts (about one gate or up value in ten passes +-7), and its biases, sinks and
    router spread (transformers starts the biases at zero and the rest small); parameters whose
    names end with any of ``also`` spread alike, and the head by ``head_std`` when given."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("experts.gate_up_proj"):
                param.normal_(std=1.0)
            elif name.endswith("experts.down_proj"):
                param.normal_(std=0.1)
            elif name.endswith(("_bias", "router.bias", "router.weight", "sinks", *also)):
                param.normal_(std=1.0)
            elif name == "lm_head.weight" and head_std is not None:
                param.normal_(std=head_std)
    return model
