"""What a Transformer must do whatever its parts: causality, padding invariance, finite output."""

from __future__ import annotations

import pytest
import torch

import transformer_kit as tk
from tests.combinations import ATTENTION, POSITIONAL, tiny_config

PARTS = [(a, p) for a in ATTENTION for p in POSITIONAL]
IDS = [f"{a}-{p}" for a, p in PARTS]


def _build(architecture, attention, positional, **overrides):
    torch.manual_seed(0)
    return tk.build_model(tiny_config(architecture, attention=attention, positional=positional,
                                      **overrides)).eval()


@pytest.mark.parametrize(("attention", "positional"), PARTS, ids=IDS)
@pytest.mark.parametrize("block", ["post_norm", "pre_norm"])
@torch.no_grad()
def test_future_target_token_does_not_change_earlier_logits(attention, positional, block):
    dec = _build("decoder", attention, positional, block=block)
    ids = torch.randint(3, 37, (2, 7))
    changed = ids.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 3) % 34 + 3
    before, after = dec(ids), dec(changed)
    torch.testing.assert_close(before[:, :4], after[:, :4], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, 4:], after[:, 4:])

    encdec = _build("encoder_decoder", attention, positional, block=block)
    src = torch.randint(3, 37, (2, 5))
    before, after = encdec(src, ids), encdec(src, changed)
    torch.testing.assert_close(before[:, :4], after[:, :4], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, 4:], after[:, 4:])


@pytest.mark.parametrize(("attention", "positional"), PARTS, ids=IDS)
@torch.no_grad()
def test_padding_a_source_row_leaves_its_logits_unchanged(attention, positional):
    model = _build("encoder_decoder", attention, positional)
    src = torch.randint(3, 37, (2, 5))
    tgt = torch.randint(3, 37, (2, 4))
    padded = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded, tgt), model(src, tgt), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("attention", "positional"), PARTS, ids=IDS)
@torch.no_grad()
def test_padding_a_prompt_on_either_side_leaves_its_logits_unchanged(attention, positional):
    model = _build("decoder", attention, positional)
    ids = torch.randint(3, 37, (1, 5))
    pad = torch.zeros(1, 3, dtype=torch.long)
    expected = model(ids)
    torch.testing.assert_close(model(torch.cat([ids, pad], 1))[:, :5], expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model(torch.cat([pad, ids], 1))[:, 3:], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("attention", "positional"), PARTS, ids=IDS)
@torch.no_grad()
def test_encoder_padding_invariance_and_batch_independence(attention, positional):
    model = _build("encoder", attention, positional)
    ids = torch.randint(3, 37, (1, 5))
    other = torch.randint(3, 37, (1, 8))
    batch = torch.cat([torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], 1), other])
    out = model(batch)
    torch.testing.assert_close(out[:1, :5], model(ids), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[1:], model(other), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@torch.no_grad()
def test_all_padding_input_gives_finite_output(attention, dtype):
    pad_row = torch.zeros(2, 6, dtype=torch.long)
    pad_row[1, :2] = 5  # a normal row beside an all-padding one
    for architecture in ("encoder", "decoder"):
        model = _build(architecture, attention, "rotary").to(dtype)
        assert torch.isfinite(model(pad_row)).all()
    model = _build("encoder_decoder", attention, "sinusoidal").to(dtype)
    out = model(pad_row, torch.randint(3, 37, (2, 4)))
    assert torch.isfinite(out).all()
    assert out.dtype == dtype


@torch.no_grad()
def test_encoder_lm_head_and_hidden_states():
    ids = torch.randint(3, 37, (2, 4))
    assert _build("encoder", "sdpa", "learned")(ids).shape == (2, 4, 16)
    assert _build("encoder", "sdpa", "learned", lm_head=True)(ids).shape == (2, 4, 37)


def test_tied_embeddings_share_one_tensor():
    model = tk.build_model(tiny_config("encoder_decoder", tie_embeddings=True))
    assert model.head.weight is model.src_embed.token.weight is model.tgt_embed.token.weight
    split = tk.build_model(tiny_config("encoder_decoder", tie_embeddings=True, vocab_size=None,
                                       src_vocab_size=30, tgt_vocab_size=40))
    assert split.head.weight is split.tgt_embed.token.weight
    assert split.src_embed.token.weight.shape == (30, 16)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (torch.tensor([[1.0, 2.0]]), "integer token ids"),
        (torch.tensor([1, 2]), r"shape \(batch, len\)"),
        (torch.tensor([[1, 37]]), "outside the vocabulary 0..36"),
        (torch.tensor([[-1, 3]]), "token id -1"),
        (torch.zeros(1, 0, dtype=torch.long), "empty"),
        ([[1, 2]], "torch.Tensor"),
    ],
)
def test_bad_inputs_get_typed_errors(bad, message):
    model = tk.build_model(tiny_config("decoder"))
    with pytest.raises(tk.InputError, match=message):
        model(bad)


def test_learned_positions_refuse_long_inputs():
    model = tk.build_model(tiny_config("decoder", positional="learned", max_len=4))
    with pytest.raises(tk.InputError, match=r"max_len=4"):
        model(torch.ones(1, 5, dtype=torch.long))


def test_encoder_decoder_refuses_mismatched_batches():
    model = tk.build_model(tiny_config("encoder_decoder"))
    with pytest.raises(tk.InputError, match="src_ids has 2 rows but tgt_ids has 3"):
        model(torch.ones(2, 4, dtype=torch.long), torch.ones(3, 2, dtype=torch.long))
