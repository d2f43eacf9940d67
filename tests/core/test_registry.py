"""The plugin system: built-ins, run-time plugins, entry-point packages, conflicts, failures."""

from __future__ import annotations

import types

import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config
from transformer_kit.plugins.attention import MatmulAttention


class DoubledScoresAttention(MatmulAttention):
    """A third-party kernel: matmul attention at twice the usual temperature scale."""

    def __init__(self, head_dim: int) -> None:
        super().__init__(scale=2.0 / head_dim**0.5)


def _plugin(*components, name="my_plugin"):
    module = types.ModuleType(name)

    @tk.hookimpl
    def transformer_kit_components():
        return list(components)

    module.transformer_kit_components = transformer_kit_components
    return module


def test_builtin_names_are_sorted_per_kind(fresh_registry):
    assert fresh_registry.names("attention") == ["einsum", "matmul", "sdpa"]
    assert fresh_registry.names("positional") == ["alibi", "learned", "none", "relative_bias", "rotary",
                                                  "sinusoidal", "sinusoidal_table"]
    assert fresh_registry.names("mask") == ["causal", "none", "sliding_window"]
    assert fresh_registry.names("block") == ["parallel", "post_norm", "post_sublayer_norm", "pre_norm",
                                             "sandwich"]
    assert fresh_registry.names("feedforward") == ["geglu", "gelu", "moe", "relu", "silu", "swiglu"]
    assert fresh_registry.names("norm") == ["layernorm", "rmsnorm"]
    assert fresh_registry.names("qk_norm") == ["per_head_rmsnorm", "rmsnorm"]
    assert fresh_registry.names("frontend") == ["audio_conv"]
    assert fresh_registry.names("features") == ["log_mel"]
    assert fresh_registry.names("attention", pattern="*mul") == ["matmul"]
    assert fresh_registry.entry("attention", "sdpa").plugin == "builtin"


def test_unknown_names_list_the_registered_ones(fresh_registry):
    with pytest.raises(tk.UnknownComponentError, match=r"Did you mean 'matmul'.*einsum, matmul, sdpa"):
        fresh_registry.get("attention", "matmull")
    with pytest.raises(tk.ConfigError, match=r"Kinds: attention"):
        fresh_registry.names("attn")


def test_create_passes_params_and_refuses_unknown_ones(fresh_registry):
    kernel = fresh_registry.create("attention", "matmul", scale=0.5)
    assert kernel.scale == 0.5
    with pytest.raises(tk.ConfigError, match=r"unknown parameter 'scal'.*Did you mean 'scale'"):
        fresh_registry.create("attention", "matmul", scal=0.5)
    with pytest.raises(tk.ConfigError, match=r"top-level key 'd_model'"):
        fresh_registry.create("norm", "layernorm", context={"d_model": 4}, d_model=8)


def test_runtime_plugin_appears_and_builds(fresh_registry):
    component = tk.Component("attention", "doubled", DoubledScoresAttention,
                             provides={"score_bias"})
    assert tk.register_plugin(_plugin(component), name="doubled_plugin") == "doubled_plugin"
    assert "doubled" in tk.get_registry().names("attention")
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", attention="doubled"))
    kernel = model.decoder.layers[0].self_attention.kernel
    assert isinstance(kernel, DoubledScoresAttention)
    assert kernel.scale == pytest.approx(2.0 / 4**0.5)  # head_dim = 16 / 4
    assert torch.isfinite(model(torch.tensor([[3, 4, 5]]))).all()
    tk.unregister_plugin("doubled_plugin")
    assert "doubled" not in tk.get_registry().names("attention")
    with pytest.raises(tk.UnknownComponentError):
        tk.build_model(tiny_config("decoder", attention="doubled"))


def test_duplicate_component_names_the_two_plugins(fresh_registry):
    clash = tk.Component("attention", "matmul", MatmulAttention)
    with pytest.raises(tk.PluginError, match=r"plugin 'builtin' and plugin 'clashing'"):
        tk.register_plugin(_plugin(clash), name="clashing")
    assert "clashing" not in fresh_registry.plugins()
    twice = _plugin(tk.Component("norm", "same", torch.nn.Identity),
                    tk.Component("norm", "same", torch.nn.Identity))
    with pytest.raises(tk.PluginError, match=r"'same' is provided by both plugin 'twice'"):
        tk.register_plugin(twice, name="twice")


def test_duplicate_plugin_name(fresh_registry):
    tk.register_plugin(_plugin(), name="once")
    with pytest.raises(tk.PluginError, match=r"'once'"):
        tk.register_plugin(_plugin(), name="once")


def test_a_raising_hook_is_named_and_the_kit_keeps_working(fresh_registry):
    broken = types.ModuleType("broken")

    @tk.hookimpl
    def transformer_kit_components():
        raise RuntimeError("boom")

    broken.transformer_kit_components = transformer_kit_components
    with pytest.raises(tk.PluginError, match=r"plugin 'broken' raised .*RuntimeError: boom"):
        tk.register_plugin(broken, name="broken")
    assert "broken" not in fresh_registry.plugins()
    assert tk.build_model(tiny_config("decoder")) is not None


def test_a_hook_returning_the_wrong_type_is_named(fresh_registry):
    wrong = types.ModuleType("wrong")
    wrong.transformer_kit_components = tk.hookimpl(lambda: ["matmul"])
    with pytest.raises(tk.PluginError, match=r"plugin 'wrong'.*str; every item must be a tk.Component"):
        tk.register_plugin(wrong, name="wrong")


def test_factory_returning_the_wrong_type_names_plugin_and_slot(fresh_registry):
    tk.register_plugin(_plugin(tk.Component("feedforward", "bogus", lambda: 42)), name="bogus_plugin")
    with pytest.raises(tk.ComponentError, match=r"decoder layer 0.feedforward.*plugin 'bogus_plugin'"):
        tk.build_model(tiny_config("decoder", feedforward="bogus"))


def test_factory_that_raises_names_the_plugin(fresh_registry):
    def explode(d_model):
        raise RuntimeError("no GPU here")

    tk.register_plugin(_plugin(tk.Component("norm", "explosive", explode)), name="explosive_plugin")
    with pytest.raises(tk.ComponentError, match=r"plugin 'explosive_plugin'.*no GPU here"):
        tk.build_model(tiny_config("decoder", norm="explosive"))


def test_missing_capability_is_refused_with_a_sentence(fresh_registry):
    no_bias = tk.Component("attention", "nobias", MatmulAttention)  # provides nothing
    tk.register_plugin(_plugin(no_bias), name="nobias_plugin")
    with pytest.raises(tk.ConfigError, match=r"positional 'alibi' needs 'score_bias'.*'matmul'"):
        tk.build_model(tiny_config("decoder", attention="nobias", positional="alibi"))


def test_invalid_components_are_refused():
    with pytest.raises(ValueError, match=r"kind 'attn'"):
        tk.Component("attn", "x", MatmulAttention)
    with pytest.raises(ValueError, match=r"name '9x'"):
        tk.Component("attention", "9x", MatmulAttention)
    with pytest.raises(TypeError, match=r"callable"):
        tk.Component("attention", "x", 3)


GOOD_PLUGIN = """
    import transformer_kit as tk
    from transformer_kit.plugins.feedforward import FeedForward
    from torch import nn

    def tanh_feedforward(d_model, d_ff, dropout):
        return FeedForward(d_model, d_ff, dropout, nn.Tanh())

    @tk.hookimpl
    def transformer_kit_components():
        return [tk.Component("feedforward", "tanh", tanh_feedforward)]
"""


def test_entry_point_package_appears_and_builds(installed_package, fresh_registry):
    installed_package("tk-tanh", "tkplugin_tanh", GOOD_PLUGIN)
    registry = tk.reset_registry()
    assert "tanh" in registry.names("feedforward")
    entry = registry.entry("feedforward", "tanh")
    assert (entry.plugin, entry.distribution) == ("tkplugin_tanh", "tk-tanh")
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("encoder", feedforward="tanh"))
    ff = model.encoder.layers[0].feedforward
    x = torch.randn(1, 2, 16)
    torch.testing.assert_close(ff(x), ff.linear2(torch.tanh(ff.linear1(x))))


def test_autoload_can_be_disabled(installed_package, fresh_registry, monkeypatch):
    installed_package("tk-tanh", "tkplugin_tanh", GOOD_PLUGIN)
    monkeypatch.setenv(tk.core.registry.DISABLE_AUTOLOAD_ENV, "1")
    registry = tk.reset_registry()
    assert "tanh" not in registry.names("feedforward")
    assert registry.names("attention") == ["einsum", "matmul", "sdpa"]  # built-ins stay


def test_plugins_can_be_blocked_by_name(installed_package, fresh_registry, monkeypatch):
    installed_package("tk-tanh", "tkplugin_tanh", GOOD_PLUGIN)
    monkeypatch.setenv(tk.core.registry.BLOCK_ENV, "tkplugin_tanh")
    assert "tanh" not in tk.reset_registry().names("feedforward")
    monkeypatch.setenv(tk.core.registry.BLOCK_ENV, "builtin")
    registry = tk.reset_registry()
    assert registry.names("attention") == []
    assert "tanh" in registry.names("feedforward")


def test_failing_entry_points_are_recorded_and_the_rest_loads(installed_package, fresh_registry):
    installed_package("tk-broken-import", "tkplugin_broken", "import not_a_module_anywhere\n")
    installed_package("tk-clash", "tkplugin_clash", """
        import transformer_kit as tk
        from torch import nn

        @tk.hookimpl
        def transformer_kit_components():
            return [tk.Component("norm", "layernorm", nn.LayerNorm)]
    """)
    with pytest.warns(RuntimeWarning) as caught:
        registry = tk.reset_registry()
    failures = {f.plugin: f for f in registry.failures}
    assert failures["tkplugin_broken"].distribution == "tk-broken-import"
    assert "ModuleNotFoundError" in failures["tkplugin_broken"].error
    assert "plugin 'builtin' and plugin 'tkplugin_clash'" in failures["tkplugin_clash"].error
    assert "distribution 'tk-clash'" in failures["tkplugin_clash"].error
    assert any("tk-broken-import" in str(w.message) for w in caught)
    assert registry.names("norm") == ["layernorm", "rmsnorm"]
    assert registry.entry("norm", "layernorm").plugin == "builtin"


def test_a_component_without_cache_support_refuses_cached_generation(fresh_registry):
    comp = tk.Component("attention", "nocache", MatmulAttention, provides={"score_bias"},
                        supports_cache=False)
    tk.register_plugin(_plugin(comp), name="nocache_plugin")
    model = tk.build_model(tiny_config("decoder", attention="nocache"))
    ids = torch.tensor([[3, 4, 5]])
    expected = r"attention 'nocache' \(plugin 'nocache_plugin'\) does not support the key/value cache"
    with pytest.raises(tk.InputError, match=expected):  # an option of the call, not the config
        model.generate(ids, 3)
    reference = tk.build_model(tiny_config("decoder"))
    reference.load_state_dict(model.state_dict())
    assert torch.equal(model.generate(ids, 3, use_cache=False), reference.generate(ids, 3))


def test_a_component_s_export_refusal_refuses_the_configurations_it_names(fresh_registry):
    """Component.export_refusal reads the module the factory made: one configuration exports,
    the other is refused naming the component and giving its sentence."""
    def refusal(kernel) -> str:
        return "a scale above 1 is not exported: use one below." if kernel.scale > 1 else ""

    comp = tk.Component("attention", "picky", MatmulAttention, provides={"score_bias"},
                        export_refusal=refusal)
    tk.register_plugin(_plugin(comp), name="picky_plugin")
    low = tk.build_model(tiny_config("decoder", attention={"name": "picky", "scale": 0.5}))
    high = tk.build_model(tiny_config("decoder", attention={"name": "picky", "scale": 2.0}))
    assert low.unexportable == [] and low.unexportable_reasons == []
    assert high.unexportable == ["attention 'picky' (plugin 'picky_plugin')"]
    assert high.unexportable_reasons == ["a scale above 1 is not exported: use one below."]


def test_the_model_components_plugin_loads_when_a_model_kind_is_asked_for(fresh_registry):
    """The built-in plugins register when first needed: the logits processors' alone for a
    processor, the model components' for a model's kind (or every listing)."""
    def deferring() -> tk.core.registry.Registry:
        registry = tk.core.registry.Registry()
        for name, (module, kinds) in tk.core.registry.BUILTIN_PLUGINS.items():
            registry.defer_plugin(name, module, kinds)
        return registry

    registry = deferring()
    assert "repetition_penalty" in registry.names("logits_processor")
    assert registry.plugins() == ["builtin", "builtin.decoding"]  # the listing loads the rest
    again = deferring()
    again.names("logits_processor")
    assert again.deferred == ["builtin"]
    assert "sdpa" in again.names("attention") and again.deferred == []


def test_hooks_are_called_through_pluggy_so_tracing_sees_them(fresh_registry):
    calls = []
    undo = fresh_registry.plugin_manager.add_hookcall_monitoring(
        lambda hook, impls, kwargs: calls.append((hook, [i.plugin_name for i in impls])),
        lambda outcome, hook, impls, kwargs: None)
    try:
        tk.register_plugin(_plugin(tk.Component("norm", "traced", torch.nn.Identity)), name="traced")
    finally:
        undo()
    assert ("transformer_kit_components", ["traced"]) in calls


def test_a_plugin_s_hook_wrapper_applies_to_its_contributions(fresh_registry):
    plugin = types.ModuleType("wrapped")

    @tk.hookimpl
    def transformer_kit_components():
        return [tk.Component("norm", "kept", torch.nn.Identity),
                tk.Component("norm", "experimental", torch.nn.Identity)]

    @tk.hookimpl(specname="transformer_kit_components", wrapper=True)
    def hide_experimental():
        lists = yield
        return [[c for c in result if c.name != "experimental"] for result in lists]

    plugin.transformer_kit_components = transformer_kit_components
    plugin.hide_experimental = hide_experimental
    tk.register_plugin(plugin, name="wrapped")
    assert "kept" in fresh_registry.names("norm")
    assert "experimental" not in fresh_registry.names("norm")


def test_plugins_that_cannot_be_hashed_register_like_modules(fresh_registry):
    plugin = types.SimpleNamespace(__name__="namespace_plugin", transformer_kit_components=tk.hookimpl(
        lambda: [tk.Component("norm", "from_namespace", torch.nn.Identity)]))
    assert tk.register_plugin(plugin) == "namespace_plugin"
    assert fresh_registry.entry("norm", "from_namespace").plugin == "namespace_plugin"


def test_checkpoint_families_come_from_plugins(fresh_registry):
    assert fresh_registry.model_types() == [
        "bart", "bert", "gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "gpt_neox",
        "gpt_oss", "granite", "granitemoe", "granitemoeshared", "llama", "marian", "mistral",
        "mixtral", "olmo2", "olmoe", "phi3", "qwen2",
        "qwen2_moe", "qwen3", "qwen3_moe",
        "roberta", "smollm3", "t5", "whisper", "xlm-roberta"]
    assert all(f.plugin == "builtin" for f in fresh_registry.families())
    family = tk.CheckpointFamily("tiny", dict, dict, probe="w")
    plugin = types.ModuleType("tiny_family")
    plugin.transformer_kit_checkpoint_families = tk.hookimpl(lambda: [family])
    tk.register_plugin(plugin)
    assert fresh_registry.family("tiny").family is family
    tk.unregister_plugin("tiny_family")
    with pytest.raises(tk.CheckpointError, match=r"model_type 'tiny' is not supported.*Supported: bart,"):
        fresh_registry.family("tiny")
    wrong = types.ModuleType("wrong_family")
    wrong.transformer_kit_checkpoint_families = tk.hookimpl(lambda: ["gpt2"])
    with pytest.raises(tk.PluginError, match=r"every item must be a tk.CheckpointFamily"):
        tk.register_plugin(wrong)


def test_blocking_builtin_removes_its_families_too(fresh_registry, monkeypatch):
    monkeypatch.setenv(tk.core.registry.BLOCK_ENV, "builtin")
    assert tk.reset_registry().model_types() == []


# -- lowerings -------------------------------------------------------------------------------------
def _writes_nothing(g, module, *inputs):
    return inputs[0]


def test_invalid_lowerings_are_refused():
    with pytest.raises(ValueError, match=r"Lowering kind 'attn' is not one of"):
        tk.Lowering("attn", "x", forward=_writes_nothing)
    with pytest.raises(ValueError, match=r"Lowering name '9x'"):
        tk.Lowering("norm", "9x", forward=_writes_nothing)
    with pytest.raises(ValueError, match=r"a norm lowering writes forward; got rotate"):
        tk.Lowering("norm", "x", rotate=_writes_nothing)
    with pytest.raises(ValueError, match=r"writes embed and/or rotate and/or score_bias; got none"):
        tk.Lowering("positional", "x")
    with pytest.raises(TypeError, match=r"forward must be callable, got int"):
        tk.Lowering("norm", "x", forward=3)
    assert set(tk.Lowering("positional", "x", rotate=_writes_nothing).methods()) == {"rotate"}


def _lowering_plugin(*lowerings, name="lowering_plugin"):
    module = types.ModuleType(name)
    module.transformer_kit_lowerings = tk.hookimpl(lambda: list(lowerings))
    return module


def _component_plugin(*components, name="component_plugin"):
    module = types.ModuleType(name)
    module.transformer_kit_components = tk.hookimpl(lambda: list(components))
    return module


def test_lowerings_come_from_plugins_and_leave_with_them(fresh_registry):
    tk.register_plugin(_component_plugin(tk.Component("norm", "someone_elses", torch.nn.Identity)),
                       name="someone")
    lowering = tk.Lowering("norm", "someone_elses", forward=_writes_nothing)
    assert fresh_registry.lowering("norm", "someone_elses") is None
    tk.register_plugin(_lowering_plugin(lowering), name="lowers")
    found = fresh_registry.lowering("norm", "someone_elses")
    assert found.lowering is lowering and found.plugin == "lowers"
    assert found in fresh_registry.lowerings()
    tk.unregister_plugin("lowers")
    assert fresh_registry.lowering("norm", "someone_elses") is None


def test_two_lowerings_of_one_component_name_both_plugins(fresh_registry):
    clash = tk.Lowering("attention", "matmul", forward=_writes_nothing)
    with pytest.raises(tk.PluginError, match=r"lowering of attention 'matmul' is provided by both "
                                             r"plugin 'builtin' and plugin 'clashing'"):
        tk.register_plugin(_lowering_plugin(clash), name="clashing")
    assert "clashing" not in fresh_registry.plugins()


def test_a_lowering_whose_component_no_plugin_provides_is_refused_with_a_sentence(fresh_registry):
    """A typo in a lowering's name would send the component to tracing unnoticed."""
    typo = tk.Lowering("norm", "rms_norm", forward=_writes_nothing)
    with pytest.raises(tk.PluginError, match=r"lowers norm 'rms_norm', which no registered plugin "
                                             r"provides\. Did you mean 'rmsnorm'\?.*Register the component"):
        tk.register_plugin(_lowering_plugin(typo), name="typo")
    assert "typo" not in fresh_registry.plugins()


def test_a_components_own_lowering_registers_with_it_and_names_nothing_else(fresh_registry):
    component = tk.Component("norm", "mine", torch.nn.Identity, lowering=tk.Lowering(forward=_writes_nothing))
    assert (component.lowering.kind, component.lowering.name) == ("norm", "mine")
    tk.register_plugin(_component_plugin(component), name="mine")
    assert fresh_registry.lowering("norm", "mine").lowering.forward is _writes_nothing
    with pytest.raises(ValueError, match=r"its lowering names attention/other; leave the lowering's"):
        tk.Component("norm", "x", torch.nn.Identity, lowering=tk.Lowering("attention", "other",
                                                                          forward=_writes_nothing))
    with pytest.raises(ValueError, match=r"a norm lowering writes forward; got rotate"):
        tk.Component("norm", "x", torch.nn.Identity, lowering=tk.Lowering(rotate=_writes_nothing))


def test_a_lowering_hook_returning_the_wrong_type_is_named(fresh_registry):
    with pytest.raises(tk.PluginError, match=r"plugin 'wrong'.*every item must be a tk.Lowering"):
        tk.register_plugin(_lowering_plugin(_writes_nothing), name="wrong")


def test_every_builtin_component_of_a_model_has_a_lowering(fresh_registry):
    missing = [f"{e.component.kind}/{e.component.name}" for e in fresh_registry.entries()
               if e.component.kind != "logits_processor"
               and fresh_registry.lowering(e.component.kind, e.component.name) is None]
    assert missing == []


def test_what_a_factory_makes_knows_its_component(fresh_registry):
    from transformer_kit.core.registry_entries import component_of

    model = tk.build_model(tiny_config("decoder", norm="rmsnorm", feedforward="swiglu"))
    layer = model.decoder.layers[0]
    assert component_of(layer).component.name == "post_norm"
    assert component_of(layer.feedforward).component.name == "swiglu"
    assert component_of(layer.self_norm).component.name == "rmsnorm"
    assert component_of(layer.self_attention.kernel).component.name == "matmul"
    assert component_of(model.mask).component.name == "causal"
    assert component_of(layer.self_attention) is None  # the core's own module
