"""check_config and build_model before allocating: every component's parameters are checked
on the meta device, the parameter count is exact, and a config too large for this machine is a
ConfigError that says how large it is."""

from __future__ import annotations

import time

import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.core import assembly
from transformer_kit.core.assembly import check_config


@pytest.mark.parametrize("architecture", ["decoder", "encoder_decoder", "encoder"])
def test_the_size_counted_on_the_meta_device_is_the_built_model_s(architecture):
    config = tiny_config(architecture, tie_embeddings=architecture != "encoder")
    size = check_config(config)
    model = tk.build_model(config)
    unique = {id(p): p for p in model.parameters()}.values()  # tied weights once
    assert size.parameters == sum(p.numel() for p in unique)
    assert size.bytes == 4 * size.parameters
    name, shape = size.largest
    assert tuple(dict(model.named_parameters())[name].shape) == shape


@pytest.mark.parametrize(("positional", "message"), [
    ({"name": "rotary", "bsae": 5e5}, r"unknown parameter 'bsae'.*Did you mean 'base'"),
    ({"name": "rotary", "base": 0.5}, r"base must be greater than 1"),
    ({"name": "learned", "token_types": -1}, r"token_types must be a non-negative integer"),
])
def test_component_parameters_are_checked_without_building(positional, message):
    with pytest.raises(tk.ConfigError, match=message):
        check_config(tiny_config("decoder", positional=positional))


@pytest.mark.parametrize("overrides", [
    {"vocab_size": 100_000_000_000, "d_model": 512},
    {"vocab_size": 1000, "d_model": 1_048_576, "num_heads": 8},
])
def test_a_config_whose_weights_cannot_exist_is_refused_before_allocating(overrides):
    start = time.perf_counter()
    with pytest.raises(tk.ConfigError, match=r"This config needs [\d,]+ parameters \([\d.]+ TB in "
                                             r"float32; the largest tensor is .*\), more than the"):
        tk.build_model({"architecture": "decoder", **overrides})
    assert time.perf_counter() - start < 60  # a bound against hanging, not a speed claim


def test_the_memory_bound_is_this_machine_s(monkeypatch):
    config = tiny_config("decoder")
    size = check_config(config)
    monkeypatch.setattr(assembly, "available_memory", lambda: size.bytes - 1)
    with pytest.raises(tk.ConfigError, match=r"more than the .* of memory available here"):
        tk.build_model(config)
    monkeypatch.setattr(assembly, "available_memory", lambda: size.bytes)
    assert tk.build_model(config) is not None


def test_a_factory_that_cannot_run_on_the_meta_device_still_builds(fresh_registry):
    import types

    from transformer_kit.plugins.norms import layer_norm

    def data_dependent_norm(d_model):
        torch.zeros(1).item()  # fails on the meta device, fine on the CPU
        return layer_norm(d_model)

    plugin = types.ModuleType("meta_shy")
    plugin.transformer_kit_components = tk.hookimpl(
        lambda: [tk.Component("norm", "meta_shy", data_dependent_norm)])
    tk.register_plugin(plugin)
    config = tiny_config("decoder", norm="meta_shy")
    assert check_config(config) is None  # size unknown, nothing refused
    model = tk.build_model(config)
    assert torch.isfinite(model(torch.tensor([[3, 4, 5]]))).all()


def test_built_models_record_their_components():
    model = tk.build_model(tiny_config("decoder", attention="sdpa"))
    optional = {"qk_norm", "pooling", "frontend", "features"}
    assert set(model.components) == set(tk.MODEL_KINDS) - optional
    with_qk_norm = tk.build_model(tiny_config("decoder", qk_norm="per_head_rmsnorm"))
    assert with_qk_norm.components["qk_norm"].component.name == "per_head_rmsnorm"
    entry = model.components["attention"]
    assert (entry.component.name, entry.plugin) == ("sdpa", "builtin")
    assert "attention" in entry.component.lowerings
    assert model.uncacheable == [] and model.unexportable == []
