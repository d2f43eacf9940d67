"""Every sampled combination exports, verifies, matches PyTorch and generates the same tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import transformer_kit as tk
from tests.export.cases import CASES
from transformer_kit.export import export_onnx
from transformer_kit.export.verify import random_ids, relative_error
from transformer_kit.export.weights import WEIGHTS_FILE
from transformer_kit.runtime import OnnxModel

SHAPES = [(1, 9), (4, 6), (3, 13)]


@pytest.fixture(scope="module", params=[c for _, c in CASES], ids=[i for i, _ in CASES])
def exported(request, tmp_path_factory):
    torch.manual_seed(0)
    model = tk.build_model(request.param).eval()
    folder = tmp_path_factory.mktemp("onnx")
    report = export_onnx(model, folder)
    return model, OnnxModel(folder, providers="cpu"), report


def test_export_verifies(exported):
    _, om, report = exported
    assert report.tolerance == 1e-4
    assert report.max_error <= 1e-4
    assert set(report.graph_bytes) == {*om.manifest.graphs, WEIGHTS_FILE}
    assert report.traced_components == {}  # every built-in component wrote its own nodes


def test_every_weight_is_stored_once(exported):
    """The graphs share one weights.data holding each tensor once: at most the model's
    parameter and buffer bytes (5 % for tensors the exporter derives, one page per aligned one)."""
    _, om, report = exported
    assert report.graph_bytes[WEIGHTS_FILE] <= 1.05 * report.weight_bytes + 64 * 1024
    graphs = sum(v for k, v in report.graph_bytes.items() if k != WEIGHTS_FILE)
    assert graphs < 0.5 * report.weight_bytes + 2e6  # structure, small constants
    assert om.provider == "CPUExecutionProvider"


@pytest.mark.parametrize(("batch", "length"), SHAPES)
@torch.no_grad()
def test_forward_matches_pytorch(exported, batch, length):
    model, om, _ = exported
    cfg = model.config
    if model.architecture == "encoder_decoder":
        src = random_ids(batch, length, cfg.src_vocab, cfg.pad_id, seed=length)
        tgt = random_ids(batch, length - 3, cfg.tgt_vocab, cfg.pad_id, seed=batch, pad_rows=False)
        inputs = (src, tgt)
    else:
        inputs = (random_ids(batch, length, cfg.vocab_size, cfg.pad_id, seed=length),)
    classifies = getattr(model, "classifier", None) is not None  # its graph gives the logits
    expected = (model.classify(*inputs)[0] if classifies else model(*inputs)).numpy()
    actual = om(*[x.numpy() for x in inputs])
    assert actual.shape == expected.shape
    assert relative_error(actual, expected) <= 1e-4


@torch.no_grad()
def test_generation_matches_pytorch_token_for_token(exported):
    model, om, _ = exported
    cfg = model.config
    if model.architecture == "encoder":  # nothing to generate with: both refuse alike
        with pytest.raises(tk.InputError, match=r"needs a decoder"):
            om.generate(np.ones((1, 3), np.int64))
        with pytest.raises(tk.InputError, match=r"needs a decoder"):
            model.generate(torch.ones(1, 3, dtype=torch.long))
        return
    ids = random_ids(4, 7, cfg.src_vocab, cfg.pad_id, seed=3)
    if model.architecture == "decoder":
        ids[2, :3] = ids[2, 4:].clone()  # a left-padded row beside right-padded ones
        ids[2, 3:] = cfg.pad_id
        ids[2] = torch.roll(ids[2], 4)
    expected = model.generate(ids, max_new_tokens=10).numpy()
    actual = om.generate(ids.numpy(), max_new_tokens=10)
    assert actual.dtype == np.int64
    np.testing.assert_array_equal(actual, expected)
    np.testing.assert_array_equal(om.generate(ids, max_new_tokens=10), expected)  # torch in


@pytest.mark.parametrize("architecture", ["decoder", "encoder_decoder", "encoder"])
def test_the_sampled_cases_hold_every_value_of_every_kind(architecture):
    from tests.combinations import ATTENTION, BLOCKS, FEEDFORWARD, NORMS, POSITIONAL, QK_NORMS
    from tests.export.cases import (
        MULTIPLIER_CASES,
        SCALED_CASES,
        SENTENCE_CASES,
        VARIANT_CASES,
        VOCABULARY_CASES,
    )

    # rotary scalings, layer variants, multipliers, sentence outputs and separate vocabularies,
    # on top of the sample
    scaled = {case_id for case_id, _ in
              SCALED_CASES + VARIANT_CASES + MULTIPLIER_CASES + SENTENCE_CASES + VOCABULARY_CASES}
    configs = [c for case_id, c in CASES if case_id.startswith(architecture + "-") and case_id not in scaled]
    for key, values in (("attention", ATTENTION), ("positional", POSITIONAL), ("block", BLOCKS),
                        ("feedforward", FEEDFORWARD), ("norm", NORMS), ("num_kv_heads", [1, 2, 4]),
                        ("qk_norm", QK_NORMS)):
        assert {c[key] for c in configs} == set(values), key


def test_the_sentence_cases_hold_each_graph_input_and_output():
    """pooling_mask (the prompt left out), dense layers; token_type_ids, logits alone."""
    from tests.export.cases import SENTENCE_CASES

    configs = [c for _, c in SENTENCE_CASES]
    sentences = [c["sentence_embedding"] for c in configs if "pooling" in c]
    assert {s.get("include_prompt", True) for s in sentences} == {True, False}
    assert any(len(s.get("dense", [])) == 2 for s in sentences)
    classifiers = [c for c in configs if "classifier" in c]
    assert {c["classifier"]["num_labels"] for c in classifiers} == {1, 3}
    assert any(isinstance(c["positional"], dict) and c["positional"].get("token_types") == 2
               for c in classifiers)


def test_the_multiplier_cases_hold_every_multiplier_in_every_architecture_with_a_head():
    from tests.combinations import BLOCKS
    from tests.export.cases import MULTIPLIER_CASES

    configs = [c for _, c in MULTIPLIER_CASES]
    assert {c["architecture"] for c in configs} == {"decoder", "encoder_decoder", "encoder"}
    assert {c["block"]["name"] for c in configs} == set(BLOCKS)
    assert all(c["block"]["residual_scale"] != 1.0 for c in configs)
    for key in ("embedding_scale", "logit_scale", "logit_softcap"):
        assert {c["architecture"] for c in configs if c.get(key)} == {
            "decoder", "encoder_decoder", "encoder"}, key
