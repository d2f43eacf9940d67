"""Property-based tests of the config (hypothesis): every random valid config builds, runs to
finite outputs of the right shape and exports with verification; every random invalid one is
refused with a ConfigError, never another exception.

The examples are derandomized (the same ones every run) so that CI is reproducible; to explore
new ones, run with ``--hypothesis-seed=<n>`` after removing ``derandomize`` locally."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transformer_kit as tk
from tests.combinations import (
    ATTENTION,
    BLOCKS,
    CAUSAL_MASKS,
    FEEDFORWARD,
    NORMS,
    POSITIONAL,
    QK_NORMS,
)

ARCHITECTURES = ["encoder_decoder", "encoder", "decoder"]
ENCODER_MASKS = ["none", *CAUSAL_MASKS]


@st.composite
def valid_configs(draw) -> dict:
    architecture = draw(st.sampled_from(ARCHITECTURES))
    heads = draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([2, 4, 6]))
    kv_heads = draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0]))
    vocab = draw(st.integers(5, 40))
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=3, max_size=3, unique=True))
    config = {
        "architecture": architecture, "vocab_size": vocab, "d_model": heads * head_dim,
        "num_heads": heads, "num_kv_heads": kv_heads, "num_layers": draw(st.integers(1, 2)),
        "d_ff": draw(st.integers(1, 12)), "dropout": draw(st.sampled_from([0.0, 0.25])),
        "max_len": draw(st.integers(8, 24)), "pad_id": ids[0], "bos_id": ids[1], "eos_id": ids[2],
        "tie_embeddings": draw(st.booleans()), "scale_embeddings": draw(st.booleans()),
        "attention_bias": draw(st.booleans()),
        "attention_out_bias": draw(st.sampled_from([None, True, False])),
        "attention": draw(st.sampled_from(ATTENTION)),
        "positional": draw(st.sampled_from(POSITIONAL)),
        "mask": draw(st.sampled_from(ENCODER_MASKS if architecture == "encoder" else CAUSAL_MASKS)),
        "block": draw(st.sampled_from(BLOCKS)), "feedforward": draw(st.sampled_from(FEEDFORWARD)),
        "norm": draw(st.sampled_from(NORMS)), "qk_norm": draw(st.sampled_from(QK_NORMS)),
    }
    if architecture == "encoder":
        config["lm_head"] = draw(st.booleans())
    residual = draw(st.sampled_from([1.0, 0.5, 2.0]))
    if residual != 1.0:
        config["block"] = {"name": config["block"], "residual_scale": residual}
    if not config["scale_embeddings"]:
        config["embedding_scale"] = draw(st.sampled_from([None, 0.5, 12.0]))
    if architecture != "encoder" or config["lm_head"]:
        config["logit_scale"] = draw(st.sampled_from([None, 0.125, 3.0]))
        config["logit_softcap"] = draw(st.sampled_from([None, 0.5, 30.0]))
    return config


def _inputs(config: dict, model) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config["vocab_size"], (2, 5), generator=gen)
    ids[ids == config["pad_id"]] = (config["pad_id"] + 1) % config["vocab_size"]
    ids[1, :2] = config["pad_id"]  # a padded row
    if config["architecture"] == "encoder_decoder":
        return ids, ids[:, :3].clone()
    return (ids,)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(valid_configs())
def test_every_valid_config_builds_and_runs_to_finite_outputs(config):
    torch.manual_seed(0)
    model = tk.build_model(config).eval()
    inputs = _inputs(config, model)
    with torch.no_grad():
        out = model(*inputs)
    width = config["vocab_size"] if config["architecture"] != "encoder" or config.get("lm_head") \
        else config["d_model"]
    assert out.shape == (2, inputs[-1].shape[1], width)
    assert torch.isfinite(out).all()
    if config["architecture"] != "encoder":
        new = model.generate(inputs[0], 3)
        assert new.shape[0] == 2 and new.shape[1] <= 3
        assert ((new >= 0) & (new < config["vocab_size"])).all()


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(config=valid_configs())
def test_every_valid_config_exports_and_verifies(tmp_path_factory, config):
    from transformer_kit.export import export_onnx

    torch.manual_seed(0)
    model = tk.build_model(config).eval()
    report = export_onnx(model, tmp_path_factory.mktemp("export") / "onnx")
    assert report.max_error is not None and report.max_error <= 1e-4
    if config["architecture"] != "encoder":
        assert report.tokens_match


# -- invalid configs ---------------------------------------------------------------------------
SIZE_KEYS = ["vocab_size", "d_model", "num_heads", "num_kv_heads", "num_layers", "d_ff", "max_len"]
BOOL_KEYS = ["tie_embeddings", "scale_embeddings", "attention_bias", "embedding_norm", "head_bias"]
KINDS_IN_CONFIG = ["attention", "positional", "mask", "block", "feedforward", "norm"]
WRONG_VALUES = ["x", 1.5, [1], {"a": 1}, None, True]


@st.composite
def invalid_configs(draw) -> tuple[dict, str]:
    """A valid config with one thing made wrong; returns it and what was changed."""
    config = copy.deepcopy(draw(valid_configs()))
    vocab = config["vocab_size"]
    mutation = draw(st.sampled_from([
        "wrong_type", "size", "dropout", "id", "kv_heads", "unknown_key", "unknown_component",
        "unknown_param", "heads", "architecture", "component_type",
    ]))
    if mutation == "wrong_type":
        key = draw(st.sampled_from(SIZE_KEYS + BOOL_KEYS + ["dropout", "pad_id", "bos_id"]))
        value = draw(st.sampled_from(WRONG_VALUES))
        if (key in BOOL_KEYS and value is True) or (key == "pad_id" and value is None):
            value = "x"
        if key == "num_kv_heads" and value is None:
            value = 1.5
        if key == "dropout" and isinstance(value, bool):
            value = "x"
        config[key] = value
    elif mutation == "size":
        config[draw(st.sampled_from(SIZE_KEYS))] = draw(st.integers(-5, 0))
    elif mutation == "dropout":
        config["dropout"] = draw(st.one_of(st.floats(1.0, 10.0), st.floats(-10.0, -1e-6),
                                           st.just(math.nan), st.just(math.inf)))
    elif mutation == "id":
        key = draw(st.sampled_from(["pad_id", "bos_id", "eos_id"]))
        config[key] = draw(st.one_of(st.integers(vocab, vocab + 50), st.integers(-20, -1)))
    elif mutation == "kv_heads":
        heads = config["num_heads"]
        config["num_kv_heads"] = draw(st.sampled_from([k for k in range(2, 9)
                                                       if heads % k or k > heads]))
    elif mutation == "heads":
        config["num_heads"] = draw(st.sampled_from([h for h in (3, 5, 7) if config["d_model"] % h]))
    elif mutation == "unknown_key":
        config[draw(st.sampled_from(["d_modle", "num_head", "dropuot", "vocabsize", "layers"]))] = 1
    elif mutation == "unknown_component":
        kind = draw(st.sampled_from(KINDS_IN_CONFIG))
        config[kind] = draw(st.sampled_from(["nonexistent", "Matmul", "rope", ""]))
    elif mutation == "unknown_param":
        kind = draw(st.sampled_from(["attention", "block", "norm"]))
        name = config[kind] if isinstance(config[kind], str) else config[kind]["name"]
        config[kind] = {"name": name, "no_such_param": 1}
    elif mutation == "architecture":
        config["architecture"] = draw(st.sampled_from(["decoder_only", "", "Encoder", 3]))
    else:  # component_type
        config[draw(st.sampled_from(KINDS_IN_CONFIG))] = draw(st.sampled_from([3, 1.5, ["causal"]]))
    return config, mutation


@settings(max_examples=300, deadline=None, derandomize=True)
@given(invalid_configs())
def test_every_invalid_config_is_refused_with_a_config_error(case):
    config, mutation = case
    with pytest.raises(tk.ConfigError) as info:
        tk.build_model(config)
    message = str(info.value)
    assert message and "Traceback" not in message, mutation
