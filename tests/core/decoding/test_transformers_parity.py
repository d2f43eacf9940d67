"""Greedy and beam search give transformers' ``generate`` tokens, batched with padding, in
PyTorch and onnxruntime, on random GPT-2, Llama and Marian checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as hf

from tests.plugins.families import parity
from tests.plugins.families.test_gpt2 import _gpt2
from tests.plugins.families.test_llama import _llama
from tests.plugins.families.test_marian import _marian
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel

CHECKPOINTS = {
    "gpt2": lambda: _gpt2(24, 4, 2, initializer_range=0.2),
    "llama": lambda: _llama(24, 6, 2, 2, initializer_range=0.2),
    "marian": lambda: _marian(16, 4, 1, 2, activation_function="gelu"),
}

CASES = {
    "greedy": {},
    "beams2": {"num_beams": 2},
    "beams4-lp1.5-early": {"num_beams": 4, "length_penalty": 1.5, "early_stopping": True},
    "beams4-lp0.7-heuristic-2returned": {"num_beams": 4, "length_penalty": 0.7,
                                         "num_return_sequences": 2},
    "beams3-never-lp-0.5": {"num_beams": 3, "early_stopping": "never", "length_penalty": -0.5},
    "no-repeat-3": {"no_repeat_ngram_size": 3},
    "beams4-no-repeat-3": {"num_beams": 4, "no_repeat_ngram_size": 3},
    "repetition-1.3": {"repetition_penalty": 1.3},
    "beams2-repetition-1.3": {"num_beams": 2, "repetition_penalty": 1.3},
    # eos ids the model really produces (taken from its greedy tokens), so rows end mid-way
    "greedy-2eos": {"eos": 2},
    "greedy-2eos-min-new-5": {"eos": 2, "min_new_tokens": 5},
    "beams4-2eos-early": {"eos": 2, "num_beams": 4, "early_stopping": True,
                          "num_return_sequences": 2},
    "beams3-2eos-heuristic-lp2": {"eos": 2, "num_beams": 3, "length_penalty": 2.0},
    "beams3-2eos-never-lp0.5": {"eos": 2, "num_beams": 3, "early_stopping": "never",
                                "length_penalty": 0.5},
    "beams2-eos-min-new-4": {"eos": 1, "num_beams": 2, "min_new_tokens": 4},
}
NEW_TOKENS = 10


@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def checkpoint(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    reference, model, _ = parity.load(request.param, CHECKPOINTS[request.param], folder)
    export_onnx(model, folder / "onnx")
    return reference, model, OnnxModel(folder / "onnx", providers="cpu")


def _prompts(model):
    """(3, 7) ids with right padding in two rows and a pad id as a real token in row 0."""
    ids, mask = parity.batch(model, size=3, length=7, seed=5)
    if model.architecture == "decoder":
        ids[0, 2] = model.config.pad_id  # a real token that equals the pad id
    return ids, mask


def _reference(reference, model, ids, mask, options, eos) -> np.ndarray:
    cfg = model.config
    gen = hf.GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=cfg.pad_id,
                              eos_token_id=eos, bos_token_id=cfg.bos_id,
                              decoder_start_token_id=cfg.bos_id, **options)
    with torch.no_grad():
        if model.architecture == "encoder_decoder":
            reference.generation_config.forced_eos_token_id = None
            out = reference.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
            return out[:, 1:].numpy()  # transformers keeps the decoder start token
        order = torch.argsort(mask, dim=1, stable=True)  # transformers wants left padding
        out = reference.generate(input_ids=ids.gather(1, order), attention_mask=mask.gather(1, order),
                                 generation_config=gen)
        return out[:, ids.shape[1]:].numpy()


def _eos_ids(reference, model, ids, mask, count: int) -> list[int]:
    """``count`` ids that greedy decoding produces at step 3 or later, none special."""
    greedy = _reference(reference, model, ids, mask, {}, model.config.eos_id)
    special = {model.config.pad_id, model.config.eos_id, model.config.bos_id}
    found = [int(t) for t in greedy[:, 3:].T.reshape(-1) if int(t) not in special]
    return list(dict.fromkeys(found))[:count]


@pytest.mark.parametrize("case", list(CASES))
def test_tokens_equal_transformers_in_both_runtimes(checkpoint, case):
    reference, model, onnx_model = checkpoint
    options = dict(CASES[case])
    ids, mask = _prompts(model)
    cfg = model.config
    eos = [cfg.eos_id]
    if "eos" in options:
        eos = _eos_ids(reference, model, ids, mask, options.pop("eos"))
        options["eos_id"] = eos
    hf_options = {k: v for k, v in options.items() if k != "eos_id"}
    expected = parity.after_eos(_reference(reference, model, ids, mask, hf_options, eos), eos, cfg.pad_id)
    ours = model.generate(ids, NEW_TOKENS, attention_mask=mask, **options).numpy()
    np.testing.assert_array_equal(ours, expected)
    ort = onnx_model.generate(ids.numpy(), NEW_TOKENS, attention_mask=mask.numpy(), **options)
    np.testing.assert_array_equal(ort, expected)
    assert len(np.unique(expected)) >= 2  # not one repeated token
    if "eos_id" in options:  # rows really end early, and not before min_new_tokens
        first_eos = [int(np.flatnonzero(np.isin(row, eos))[0]) for row in expected
                     if np.isin(row, eos).any()]
        assert min(first_eos, default=NEW_TOKENS) >= options.get("min_new_tokens", 0)
        if "num_beams" not in options and "min_new_tokens" not in options:
            assert first_eos and min(first_eos) < NEW_TOKENS - 1


def test_a_prompt_holding_the_pad_id_equals_transformers_with_a_mask(checkpoint):
    """With an explicit mask the pad id is an ordinary token; pad_id alone would mask it."""
    reference, model, onnx_model = checkpoint
    if model.architecture != "decoder":
        pytest.skip("the pad id as a real source token: covered by the generation cases")
    ids, mask = _prompts(model)
    assert (ids[mask.bool()] == model.config.pad_id).any()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits.numpy()
        ours = model(ids, attention_mask=mask).numpy()
        without_mask = model(ids).numpy()
    real = mask.numpy().astype(bool)
    assert parity.relative_error(ours[real], expected[real]) <= parity.TOLERANCE
    ort = onnx_model(ids.numpy(), attention_mask=mask.numpy())
    assert parity.relative_error(ort[real], expected[real]) <= parity.TOLERANCE
    assert parity.relative_error(without_mask[real], expected[real]) > 0.01  # pad_id alone differs
