"""The multipliers a config may set: ``embedding_scale`` on the token embeddings, the blocks'
``residual_scale`` on each sub-layer's output, ``logit_scale`` and ``logit_softcap`` on the
output head's logits; each computed as its formula says, and refused with a sentence when
impossible."""

from __future__ import annotations

import pytest
import torch

import transformer_kit as tk
from tests.combinations import BLOCKS, tiny_config
from transformer_kit.core.stacks import self_attention_inputs

IDS = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 11, 12]])


def _outputs(module: torch.nn.Module, names: list[str]) -> tuple[dict, list]:
    """Forward hooks recording the inputs and outputs of ``module``'s submodules ``names``."""
    seen: dict[str, tuple] = {}
    handles = [getattr(module, name).register_forward_hook(
        lambda _, args, out, name=name: seen.__setitem__(name, (args[0], out))) for name in names]
    return seen, handles


def test_embedding_scale_multiplies_the_token_embeddings():
    model = tk.build_model(tiny_config("decoder", positional="none", embedding_scale=12.0)).eval()
    embedded = model.embed(IDS, torch.zeros_like(IDS))
    torch.testing.assert_close(embedded, model.embed.token.weight[IDS] * 12.0, rtol=0, atol=0)
    assert model.config.scale_embeddings is False  # the default gives way to embedding_scale


def test_embedding_scale_and_scale_embeddings_both_given_are_refused():
    with pytest.raises(tk.ConfigError, match=r"'embedding_scale' \(2.0\) and 'scale_embeddings' true "
                                             r"both scale the token embeddings; give one"):
        tk.build_model(tiny_config("decoder", embedding_scale=2.0, scale_embeddings=True))


@pytest.mark.parametrize("key", ["embedding_scale", "logit_scale", "logit_softcap"])
@pytest.mark.parametrize("value", [0, -1.5, float("inf")])
def test_a_scale_that_is_not_a_positive_number_is_refused_naming_the_key(key, value):
    with pytest.raises(tk.ConfigError, match=f"key '{key}'"):
        tk.build_model(tiny_config("decoder", **{key: value}))


@pytest.mark.parametrize("key", ["logit_scale", "logit_softcap"])
def test_logit_transforms_need_an_output_head(key):
    with pytest.raises(tk.ConfigError, match=f"'{key}' applies to the output head's logits; an "
                                             "encoder has a head only with 'lm_head' true"):
        tk.build_model(tiny_config("encoder", **{key: 2.0}))
    tk.build_model(tiny_config("encoder", lm_head=True, **{key: 2.0}))


@pytest.mark.parametrize("architecture", ["decoder", "encoder_decoder", "encoder"])
def test_logits_are_scaled_then_capped(architecture):
    torch.manual_seed(0)
    config = tiny_config(architecture, logit_scale=4.0, logit_softcap=0.5, head_bias=True,
                         tie_embeddings=True, lm_head=architecture == "encoder")
    model = tk.build_model(config).eval()
    seen, _ = _outputs(model, ["head"])
    inputs = (IDS, IDS[:, :3]) if architecture == "encoder_decoder" else (IDS,)
    with torch.no_grad():
        logits = model(*inputs)
    hidden = seen["head"][0]
    raw = hidden @ model.head.weight.T + model.head.bias
    torch.testing.assert_close(logits, 0.5 * torch.tanh(raw * 4.0 / 0.5))
    assert logits.abs().max() <= 0.5 < (raw * 4.0).abs().max()  # the cap really bites
    names = {n for n, _ in model.named_parameters() if n.startswith("head.")}
    assert names == {"head.bias"}  # the tied weight is the embedding's; no new parameter


def test_the_logit_transforms_survive_save_and_load(tmp_path):
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", logit_scale=0.125, logit_softcap=3.0,
                                       embedding_scale=5.0)).eval()
    model.save(tmp_path)
    loaded = tk.load_model(tmp_path).eval()
    assert loaded.config == model.config
    with torch.no_grad():
        assert torch.equal(loaded(IDS), model(IDS))


@pytest.mark.parametrize("block", BLOCKS)
def test_residual_scale_multiplies_what_each_sublayer_adds(block):
    torch.manual_seed(0)
    config = tiny_config("decoder", block={"name": block, "residual_scale": 0.3})
    model = tk.build_model(config).eval()
    layer = model.decoder.layers[0]
    names = ["self_attention", "feedforward", "self_norm", "ff_norm"]
    seen, _ = _outputs(layer, names + (["self_post_norm", "ff_post_norm"] if block == "sandwich" else []))
    x = torch.randn(2, 5, 16)
    real = torch.ones(2, 5, dtype=torch.bool)
    with torch.no_grad():
        out = layer(x, self_attention_inputs(real, 5, model.embed.positional, model.mask))
    attention, ff = seen["self_attention"][1], seen["feedforward"][1]
    if block == "post_norm":  # norm(x + s attention(x)), then norm(h + s ff(h))
        torch.testing.assert_close(seen["self_norm"][0], x + 0.3 * attention)
        torch.testing.assert_close(seen["ff_norm"][0], seen["self_norm"][1] + 0.3 * ff)
    elif block == "post_sublayer_norm":  # x + s norm(attention(x)) + s norm(ff(h))
        torch.testing.assert_close(out, x + 0.3 * seen["self_norm"][1] + 0.3 * seen["ff_norm"][1])
    elif block == "sandwich":  # x + s post_norm(attention(norm(x))) + s post_norm(ff(norm(h)))
        torch.testing.assert_close(out, x + 0.3 * seen["self_post_norm"][1] + 0.3 * seen["ff_post_norm"][1])
    else:  # pre_norm, parallel: x + s attention(norm(x)) + s ff(norm(.))
        torch.testing.assert_close(out, x + 0.3 * attention + 0.3 * ff)


@pytest.mark.parametrize("value", [0, -0.5, float("nan"), "1", True])
def test_a_residual_scale_that_is_not_a_positive_number_is_refused(value):
    with pytest.raises(tk.ConfigError, match=r"block 'pre_norm' .*residual_scale must be a positive "
                                             r"number"):
        tk.build_model(tiny_config("decoder", block={"name": "pre_norm", "residual_scale": value}))
