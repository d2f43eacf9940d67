"""Shared by the family tests: a random checkpoint written by transformers, loaded with
``tk.from_hf``, must give transformers' outputs in PyTorch and onnxruntime and its greedy tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import transformers as hf

import transformer_kit as tk
from transformer_kit.export import export_onnx
from transformer_kit.export.verify import relative_error
from transformer_kit.runtime import OnnxModel

TOLERANCE = 1e-4
VOCAB = 61


def load(name: str, make: Callable[[], torch.nn.Module], folder: Path):
    """(transformers' model, ours, the checkpoint folder), with a pad id for models without one."""
    torch.manual_seed(sum(map(ord, name)))
    reference = make().eval()
    reference.save_pretrained(folder)
    overrides = {"pad_id": 0} if reference.config.get_text_config().pad_token_id is None else {}
    return reference, tk.from_hf(folder, **overrides), folder


def random_norms(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every norm weight drawn at random (transformers starts them at one, which
    would hide a norm weight read from the wrong tensor or not at all)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


def batch(model, size: int = 3, length: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids avoiding special tokens, with right padding in row 1 (and a short row 2), and their
    attention mask."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB - 2, (size, length), generator=gen)
    pad = model.config.pad_id
    ids[1, length - 3:] = pad
    if size > 2:
        ids[2, 4:] = pad
    return ids, (ids != pad).long()


def reference_outputs(reference, model, ids, mask) -> tuple[torch.Tensor, tuple]:
    """transformers' output for our inputs, and the inputs our model takes."""
    with torch.no_grad():
        if model.architecture == "encoder":
            return reference(input_ids=ids, attention_mask=mask).last_hidden_state, (ids,)
        if model.architecture == "encoder_decoder":
            tgt = torch.randint(3, VOCAB - 2, (ids.shape[0], 5), generator=torch.Generator().manual_seed(1))
            out = reference(input_ids=ids, attention_mask=mask, decoder_input_ids=tgt).logits
            return out, (ids, tgt)
        return reference(input_ids=ids, attention_mask=mask).logits, (ids,)


def real_positions(x, mask: torch.Tensor, model) -> np.ndarray:
    """Positions that are real tokens (padded positions are not defined alike everywhere)."""
    x = np.asarray(x)
    return x if model.architecture == "encoder_decoder" else x[mask.numpy().astype(bool)]


def check_pytorch(reference, model) -> None:
    ids, mask = batch(model)
    expected, inputs = reference_outputs(reference, model, ids, mask)
    with torch.no_grad():
        ours = model(*inputs, attention_mask=mask)  # the mask given, not inferred from pad_id
    assert ours.shape == expected.shape
    assert relative_error(real_positions(ours, mask, model),
                          real_positions(expected, mask, model)) <= TOLERANCE


def check_onnxruntime(reference, model, folder: Path) -> None:
    report = export_onnx(model, folder)
    # the export's tolerance: 1e-4, or more where PyTorch's own float32 rounding spreads more
    tolerance = max(TOLERANCE, report.tolerance)
    assert report.max_error <= tolerance
    ids, mask = batch(model, size=2, length=11, seed=2)
    expected, inputs = reference_outputs(reference, model, ids, mask)
    om = OnnxModel(folder, providers="cpu")
    ours = om(*[x.numpy() for x in inputs], attention_mask=mask.numpy())
    assert relative_error(real_positions(ours, mask, model),
                          real_positions(expected, mask, model)) <= tolerance
    if model.architecture != "encoder":
        check_generation(reference, model, om)


def after_eos(tokens: np.ndarray, eos: list[int], fill: int) -> np.ndarray:
    """Tokens with everything after each row's first eos set to ``fill`` (transformers fills
    finished beams with eos when the pad id is 0; the kit always fills with the pad id)."""
    tokens = np.array(tokens)
    is_eos = np.isin(tokens, eos)
    tokens[np.cumsum(is_eos, axis=1) - is_eos > 0] = fill
    return tokens


def check_generation(reference, model, om) -> None:
    """Greedy and beam-search generation in onnxruntime and PyTorch equal transformers'
    ``generate`` (beam search: 3 beams, 2 returned)."""
    cfg = model.config
    ids, mask = batch(model, size=3, length=6, seed=3)
    for options in ({"num_beams": 1}, {"num_beams": 3, "num_return_sequences": 2}):
        gen = hf.GenerationConfig(do_sample=False, max_new_tokens=12, pad_token_id=cfg.pad_id,
                                  eos_token_id=cfg.eos_id, bos_token_id=cfg.bos_id,
                                  decoder_start_token_id=cfg.bos_id,
                                  forced_bos_token_id=cfg.forced_bos_id, **options)
        if model.architecture == "encoder_decoder":
            # transformers may force eos at the length limit; the kit's decoding does not
            reference.config.forced_eos_token_id = None
            reference.generation_config.forced_eos_token_id = None
            with torch.no_grad():
                out = reference.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
            expected = out[:, 1:].numpy()  # transformers keeps the decoder start token
        else:
            order = torch.argsort(mask, dim=1, stable=True)  # transformers wants left padding
            with torch.no_grad():
                out = reference.generate(input_ids=ids.gather(1, order),
                                         attention_mask=mask.gather(1, order), generation_config=gen)
            expected = out[:, ids.shape[1]:].numpy()
        expected = after_eos(expected, cfg.eos_ids, cfg.pad_id)
        ours = om.generate(ids.numpy(), max_new_tokens=12, attention_mask=mask.numpy(), **options)
        np.testing.assert_array_equal(ours[:, :expected.shape[1]], expected, err_msg=str(options))
        assert (ours[:, expected.shape[1]:] == cfg.pad_id).all()  # transformers stops sooner
        torch_ours = model.generate(ids, max_new_tokens=12, attention_mask=mask, **options).numpy()
        np.testing.assert_array_equal(torch_ours, ours, err_msg=str(options))
        assert expected.shape[1] >= 3 and len(np.unique(expected)) >= 2, expected  # not one repeated token


def check_save_and_load(reference, model, folder: Path, saved: Path) -> None:
    overrides = {"pad_id": 0} if reference.config.get_text_config().pad_token_id is None else {}
    assert tk.config_from_hf(folder, **overrides) == model.config
    model.save(saved)
    loaded = tk.load_model(saved).eval()
    assert loaded.config == model.config
    ids, mask = batch(model)
    _, inputs = reference_outputs(reference, model, ids, mask)
    with torch.no_grad():
        assert torch.equal(loaded(*inputs), model(*inputs))


class FamilyParity:
    """The tests every checkpoint family passes. A family's test module subclasses this with
    ``CHECKPOINTS = {id: function making a random transformers model}``; each test runs once
    per checkpoint (``conftest.py`` parametrizes ``checkpoint`` from the class's table)."""

    CHECKPOINTS: ClassVar[dict[str, Callable[[], torch.nn.Module]]] = {}

    def test_outputs_equal_transformers_in_pytorch(self, checkpoint):
        reference, model, _ = checkpoint
        check_pytorch(reference, model)

    def test_outputs_and_tokens_equal_transformers_in_onnxruntime(self, checkpoint, tmp_path):
        reference, model, _ = checkpoint
        check_onnxruntime(reference, model, tmp_path / "onnx")

    def test_config_and_weights_survive_save_and_load(self, checkpoint, tmp_path):
        reference, model, folder = checkpoint
        check_save_and_load(reference, model, folder, tmp_path / "saved")
