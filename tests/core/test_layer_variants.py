"""Per-layer variation: ``layer_types`` and ``layer_variants`` validated with sentences, each
layer built with its variant's components, and each layer attending with its own mask and
positions (checked against layers computed one by one)."""

from __future__ import annotations

import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.core.stacks import self_attention_inputs
from transformer_kit.plugins.masks import SlidingWindowMask

VARIANTS = {"local": {"mask": {"name": "sliding_window", "window": 2},
                      "positional": {"name": "rotary", "base": 50.0}},
            "global": {}, "nope": {"positional": "none", "feedforward": "gelu",
                                   "attention": {"name": "matmul", "scale": 0.5}}}


def _config(**overrides):
    config = tiny_config("decoder", num_layers=3, positional="rotary", mask="causal",
                         block="pre_norm", feedforward="swiglu", attention="sdpa",
                         layer_types=["local", "global", "nope"], layer_variants=VARIANTS)
    return {**config, **overrides}


@pytest.mark.parametrize(("overrides", "message"), [
    ({"layer_types": ["local", "global"]}, "'layer_types' has 2 entries but the model has 3 layers"),
    ({"layer_types": ["local", "global", "gloabl"]}, "names 'gloabl', not a key of 'layer_variants'"),
    ({"layer_variants": {**VARIANTS, "spare": {}}}, "'layer_variants' has 'spare', which no entry"),
    ({"layer_variants": {**VARIANTS, "global": {"block": "post_norm"}}},
     "'layer_variants.global' replaces 'block', which cannot vary by layer"),
    ({"layer_variants": {**VARIANTS, "global": {"qk_norm": "rmsnorm"}}},
     "replaces 'qk_norm', but the model has none"),
    ({"layer_types": None}, "'layer_variants' is given without 'layer_types'"),
])
def test_bad_layer_types_are_refused_with_a_sentence(overrides, message):
    with pytest.raises(tk.ConfigError, match=message):
        tk.build_model(_config(**overrides))


def test_layer_types_apply_to_one_stack_models_only():
    config = tiny_config("encoder_decoder", layer_types=["a", "a"], layer_variants={"a": {}})
    with pytest.raises(tk.ConfigError, match="not encoder_decoder"):
        tk.build_model(config)


def test_a_variant_is_checked_like_the_top_level_components():
    with pytest.raises(tk.ConfigError, match=r"mask 'none' \(in layer_variants.global\) is not causal"):
        tk.build_model(_config(layer_variants={**VARIANTS, "global": {"mask": "none"}}))
    with pytest.raises(tk.ConfigError, match=r"layer_variants\.nope\.positional"):
        tk.build_model(_config(layer_variants={**VARIANTS, "nope": {"positional": "rotaryy"}}))
    with pytest.raises(tk.ConfigError, match="adds to the embeddings"):
        tk.build_model(_config(layer_variants={**VARIANTS, "nope": {"positional": "learned"}}))


def test_each_layer_is_built_with_its_variant_s_components():
    model = tk.build_model(_config())
    local, global_, nope = model.decoder.layers
    assert type(nope.feedforward).__name__ != type(local.feedforward).__name__
    assert nope.self_attention.kernel.scale == 0.5 and global_.self_attention.kernel.scale is None
    assert tk.load_config(model.config.to_dict()) == model.config


def test_each_layer_attends_with_its_own_mask_and_positions():
    torch.manual_seed(0)
    model = tk.build_model(_config()).eval()
    ids = torch.randint(3, 37, (2, 7))
    with torch.no_grad():
        x = model.embed(ids, torch.arange(7).expand(2, 7))
        real = torch.ones(2, 7, dtype=torch.bool)
        own = model.decoder.variants.positionals
        windows = {"local": SlidingWindowMask(2), "global": model.mask, "nope": model.mask}
        positionals = {"local": own["local"], "global": model.embed.positional, "nope": own["nope"]}
        for layer, name in zip(model.decoder.layers, ["local", "global", "nope"], strict=True):
            x = layer(x, self_attention_inputs(real, 7, positionals[name], windows[name]))
        expected = model.head(model.decoder.final_norm(x))
        torch.testing.assert_close(model(ids), expected, rtol=0, atol=0)
        # the window bites: the same weights with the local layer's window left out differ
        unwindowed = tk.build_model({**_config(), "layer_variants": {
            **VARIANTS, "local": {"positional": {"name": "rotary", "base": 50.0}}}}).eval()
        unwindowed.load_state_dict(model.state_dict())
        assert not torch.allclose(model(ids), unwindowed(ids), atol=1e-4)


def test_cached_steps_equal_the_whole_sequence():
    torch.manual_seed(1)
    model = tk.build_model(_config()).eval()
    ids = torch.randint(3, 37, (2, 8))
    with torch.no_grad():
        full = model(ids)
        cache, real, steps = model.new_cache(2, full), torch.ones(2, 0, dtype=torch.bool), []
        for t in range(8):
            real = torch.cat([real, torch.ones(2, 1, dtype=torch.bool)], 1)
            steps.append(model.step(ids[:, t:t + 1], real, cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
