"""Property-based tests of the config (hypothesis): every random valid config builds, runs to
finite outputs of the right shape and exports with verification; every random invalid one is
refused with a ConfigError, never another exception.

The examples are derandomized (the same ones every run) so that CI is reproducible; to explore
new ones, run with ``--hypothesis-seed=<n>`` after removing ``derandomize`` locally."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import transformer_kit as tk
from tests.combinations import (
    ATTENTION,
    BLOCKS,
    FEEDFORWARD,
    NORMS,
    POOLINGS,
    POSITIONAL,
    QK_NORMS,
)

ARCHITECTURES = ["encoder_decoder", "encoder", "decoder"]
ACTIVATIONS = ["identity", "tanh", "sigmoid", "relu", "gelu", "silu", "softmax"]


def _named(name: str, params: dict) -> str | dict:
    """A component entry as a config writes it: the name alone, or with its parameters."""
    return {"name": name, **params} if params else name


def _some(draw, options: dict) -> dict:
    """Each of ``options`` (key -> strategy) drawn or left out (the component's default)."""
    return {key: draw(strategy) for key, strategy in options.items() if draw(st.booleans())}


def _attention(draw) -> str | dict:
    return _named(draw(st.sampled_from(ATTENTION)), _some(draw, {
        "scale": st.sampled_from([0.2, 0.7, 1.5]), "softcap": st.sampled_from([1.5, 30.0]),
        "sinks": st.booleans()}))


def _rotary_scaling(draw, rotary_dim: int) -> dict:
    kind = draw(st.sampled_from(["linear", "llama3", "yarn", "longrope"]))
    if kind == "linear":
        return {"type": "linear", "factor": draw(st.sampled_from([2.0, 4.0]))}
    if kind == "llama3":
        return {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": draw(st.sampled_from([4, 8]))}
    if kind == "yarn":
        return {"type": "yarn", "factor": draw(st.sampled_from([2.0, 4.0])),
                "original_max_position_embeddings": 8, **_some(draw, {
                    "beta_fast": st.just(16), "beta_slow": st.just(2), "truncate": st.booleans(),
                    "attention_factor": st.just(1.1)})}
    factors = st.lists(st.sampled_from([1.0, 1.5, 2.0, 6.0]), min_size=rotary_dim // 2,
                       max_size=rotary_dim // 2)
    return {"type": "longrope", "original_max_position_embeddings": draw(st.sampled_from([4, 8])),
            "short_factor": draw(factors), "long_factor": draw(factors),
            **_some(draw, {"attention_factor": st.just(1.2)})}


def _positional(draw, head_dim: int, names: list[str]) -> str | dict:
    """A positional encoding among ``names``, with parameters drawn for it."""
    name = draw(st.sampled_from(names))
    params: dict = {}
    if name == "sinusoidal":
        params = _some(draw, {"base": st.sampled_from([100.0, 10000.0]),
                              "layout": st.sampled_from(["interleaved", "split"])})
    elif name == "learned":
        params = _some(draw, {"token_types": st.sampled_from([0, 2]), "offset": st.sampled_from([0, 2])})
    elif name == "rotary":
        rotary_dim = draw(st.sampled_from(range(2, head_dim + 1, 2)))
        params = _some(draw, {"base": st.sampled_from([100.0, 500000.0])})
        if rotary_dim != head_dim:
            params["rotary_dim"] = rotary_dim
        if draw(st.booleans()):
            params["scaling"] = _rotary_scaling(draw, rotary_dim)
    elif name == "relative_bias":
        params = _some(draw, {"num_buckets": st.sampled_from([8, 32]), "max_distance": st.just(20)})
    return _named(name, params)


def _mask(draw, architecture: str) -> str | dict:
    name = draw(st.sampled_from(["none", "causal", "sliding_window"] if architecture == "encoder"
                                else ["causal", "sliding_window"]))
    return {"name": name, "window": draw(st.integers(1, 4))} if name == "sliding_window" else name


#: swiglu's clamped form (gpt-oss's experts) drawn option by option.
_CLAMPED_SWIGLU = {"alpha": st.sampled_from([1.0, 1.702]), "limit": st.sampled_from([None, 0.5, 7.0]),
                   "up_offset": st.sampled_from([0.0, 1.0])}


def _moe(draw) -> dict:
    """A mixture of experts of the configurations that export (softmax routers, sigmoid
    renormalised, swiglu experts, plain or clamped, with or without biases; its tests refuse the
    others)."""
    experts = draw(st.integers(1, 4))
    expert = st.builds(lambda params: {"name": "swiglu", **params},
                       st.fixed_dictionaries({}, optional={"bias": st.booleans(), **_CLAMPED_SWIGLU}))
    spec = {"name": "moe", "num_experts": experts, "top_k": draw(st.integers(1, experts)),
            **_some(draw, {"router": st.sampled_from(["softmax", "softmax_topk", "sigmoid"]),
                           "normalize": st.booleans(), "expert_d_ff": st.integers(2, 9),
                           "shared_expert_d_ff": st.sampled_from([0, 5]),
                           "router_bias": st.booleans(), "expert": expert})}
    if spec.get("router") == "sigmoid":  # exported as log(sigmoid) only renormalised
        spec["normalize"] = True
    return spec


def _feedforward(draw) -> str | dict:
    name = draw(st.sampled_from([*FEEDFORWARD, "moe"]))
    if name == "moe":
        return _moe(draw)
    options = {"bias": st.booleans()}
    if name in ("gelu", "geglu"):
        options["approximate"] = st.sampled_from(["none", "tanh"])
    if name == "swiglu":
        options.update(_CLAMPED_SWIGLU)
    return _named(name, _some(draw, options))


def _norm(draw) -> str | dict:
    name = draw(st.sampled_from(NORMS))
    options = {"eps": st.sampled_from([1e-6, 1e-5, 0.1])}
    options["bias" if name == "layernorm" else "unit_offset"] = st.booleans()
    return _named(name, _some(draw, options))


def _qk_norm(draw) -> str | dict | None:
    name = draw(st.sampled_from(QK_NORMS))
    if name is None:
        return None
    options = {"eps": st.sampled_from([1e-6, 0.1])}
    if name == "per_head_rmsnorm":
        options["unit_offset"] = st.booleans()
    return _named(name, _some(draw, options))


def _layer_variants(draw, config: dict, head_dim: int) -> None:
    """Per-layer variation (``layer_types``): up to two variants, each replacing some of the
    kinds a layer may vary (a variant's positional encoding acts inside attention only)."""
    names = draw(st.lists(st.sampled_from(["local", "global", "nope"]), min_size=1, max_size=2,
                          unique=True))
    variants = {}
    for name in names:
        kinds = {"mask": lambda: _mask(draw, config["architecture"]),
                 "positional": lambda: _positional(draw, head_dim, ["rotary", "alibi", "relative_bias",
                                                                   "none"]),
                 "attention": lambda: _attention(draw), "feedforward": lambda: _feedforward(draw),
                 "norm": lambda: _norm(draw)}
        if config["qk_norm"] is not None:
            kinds["qk_norm"] = lambda: _qk_norm(draw) or "rmsnorm"
        chosen = draw(st.lists(st.sampled_from(sorted(kinds)), max_size=3, unique=True))
        variants[name] = {kind: kinds[kind]() for kind in chosen}
    count = config["num_layers"]
    variants = {name: variants[name] for name in names[:count]}  # every variant used
    config["layer_types"] = draw(st.permutations([names[i % len(variants)] for i in range(count)]))
    config["layer_variants"] = variants


def _sentence_outputs(draw, config: dict) -> None:
    """An encoder's head: an LM head, a sentence embedding (pooling, dense layers, prompts) or
    a classifier, or none."""
    head = draw(st.sampled_from(["none", "lm_head", "pooling", "classifier"]))
    if head == "lm_head":
        config["lm_head"] = True
    elif head == "pooling":
        config["pooling"] = draw(st.sampled_from(POOLINGS))
        widths = [config["d_model"], *draw(st.lists(st.integers(1, 6), max_size=2))]
        dense = [{"in_features": a, "out_features": b, "bias": draw(st.booleans()),
                  "activation": draw(st.sampled_from(ACTIVATIONS))}
                 for a, b in itertools.pairwise(widths)]
        prompts = draw(st.sampled_from([{}, {"query": "query: "}]))
        config["sentence_embedding"] = {
            "dense": dense, "normalize": draw(st.booleans()), "include_prompt": draw(st.booleans()),
            "prompts": prompts, "default_prompt_name": "query" if prompts and draw(st.booleans()) else None,
            "similarity": draw(st.sampled_from(["cosine", "dot", "euclidean", "manhattan"]))}
    elif head == "classifier":
        labels = draw(st.integers(1, 3))
        config["classifier"] = {
            "num_labels": labels, "pooler_activation": draw(st.sampled_from(ACTIVATIONS)),
            "activation": draw(st.sampled_from([None, *ACTIVATIONS])),
            "labels": draw(st.sampled_from([None, [f"label{i}" for i in range(labels)]]))}
    if head in ("pooling", "classifier"):
        config["max_seq_length"] = draw(st.sampled_from([None, 6]))
        config["lowercase"] = draw(st.booleans())


def _feature_source(draw, config: dict) -> None:
    """An encoder-decoder whose source is features (speech): the audio stem, optionally a
    log-mel front end before it, and the encoder's own positional encoding."""
    channels = draw(st.sampled_from([3, 5]))
    config["frontend"] = _named("audio_conv", {"in_channels": channels, **_some(draw, {
        "kernel_size": st.sampled_from([1, 3]), "stride": st.sampled_from([1, 2])})})
    if draw(st.booleans()):
        config["features"] = {"name": "log_mel", "n_mels": channels, "n_fft": 16, "hop_length": 4,
                              **_some(draw, {"dynamic_range": st.sampled_from([2.0, 8.0])})}
    if draw(st.booleans()):
        config["speech"] = _speech(draw, config)
    names = ["sinusoidal", "learned", "none"]
    if config["d_model"] % 2 == 0 and config["d_model"] >= 4:
        names.append("sinusoidal_table")
    if draw(st.booleans()):
        name = draw(st.sampled_from(names))
        config["encoder_positional"] = {"name": "sinusoidal_table", "length": 16} \
            if name == "sinusoidal_table" else name


def _speech(draw, config: dict) -> dict:
    """Whisper's transcription settings (``speech``) for the config's target vocabulary and
    decoder: every field, ids drawn from the vocabulary, alignment heads from the decoder's
    layers and heads (the export then writes the alignment graph, and verifies it)."""
    vocab = config.get("tgt_vocab_size") or config["vocab_size"]
    layers = config.get("decoder_layers") or config["num_layers"]
    token = st.integers(0, vocab - 1)
    names = ["start_of_transcript", "end_of_text", "transcribe", "translate", "start_of_prev",
             "no_speech", "no_timestamps", "timestamp_begin"]
    heads = [[layer, head] for layer in range(layers) for head in range(config["num_heads"])]
    return {
        **{name: draw(token) for name in names},
        "multilingual": draw(st.booleans()),
        "languages": draw(st.dictionaries(st.sampled_from(["en", "de", "zh"]), token, max_size=2)),
        "suppress_tokens": draw(st.lists(token, max_size=3)),
        "begin_suppress_tokens": draw(st.lists(token, max_size=2)),
        "alignment_heads": draw(st.lists(st.sampled_from(heads), max_size=3)),
        **_some(draw, {"max_initial_timestamp_index": st.sampled_from([None, 0, 50]),
                       "median_filter_width": st.sampled_from([1, 3, 7]),
                       "time_precision": st.sampled_from([0.02, 0.04])}),
    }


@st.composite
def valid_configs(draw) -> dict:
    """A random valid config drawing every field a user can set: sizes, separate source and
    target vocabularies, ids (none, one or several end ids), every component with its
    parameters, per-layer variants, multipliers, an encoder's heads, a speech model's source."""
    architecture = draw(st.sampled_from(ARCHITECTURES))
    heads = draw(st.sampled_from([1, 2, 4]))
    head_dim = draw(st.sampled_from([2, 4, 6]))
    kv_heads = draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0]))
    d_model = heads * head_dim
    config: dict = {"architecture": architecture, "d_model": d_model}
    if draw(st.booleans()):  # a head width of its own (T5's d_kv): d_model need not divide
        d_model = config["d_model"] = draw(st.integers(2, 16))
        config["head_dim"] = head_dim
    features = architecture == "encoder_decoder" and draw(st.integers(0, 3)) == 0  # speech
    if architecture == "encoder_decoder" and not features and draw(st.booleans()):  # translation
        src, tgt = draw(st.integers(5, 40)), draw(st.integers(5, 40))
        config["src_vocab_size"], config["tgt_vocab_size"] = src, tgt
    else:
        config["vocab_size"] = src = tgt = draw(st.integers(5, 40))
    ids = draw(st.lists(st.integers(0, min(src, tgt) - 1), min_size=4, max_size=4, unique=True))
    config.update({
        "num_heads": heads, "num_kv_heads": kv_heads, "num_layers": draw(st.integers(1, 3)),
        "d_ff": draw(st.integers(1, 12)), "dropout": draw(st.sampled_from([0.0, 0.25])),
        "max_len": draw(st.integers(8, 24)),
        "pad_id": draw(st.sampled_from([ids[0], None])), "bos_id": draw(st.sampled_from([ids[1], None])),
        "eos_id": draw(st.sampled_from([ids[2], [ids[2], ids[3]], None])),
        "forced_bos_id": draw(st.sampled_from([None, ids[3]])),
        "tie_embeddings": draw(st.booleans()), "scale_embeddings": draw(st.booleans()),
        "attention_bias": draw(st.booleans()),
        "attention_out_bias": draw(st.sampled_from([None, True, False])),
        "embedding_norm": draw(st.booleans()), "head_bias": draw(st.booleans()),
        "attention": _attention(draw),
        "positional": _positional(draw, head_dim, POSITIONAL),
        "mask": _mask(draw, architecture),
        "block": _named(draw(st.sampled_from(BLOCKS)),
                        _some(draw, {"residual_scale": st.sampled_from([0.5, 2.0])})),
        "feedforward": _feedforward(draw), "norm": _norm(draw), "qk_norm": _qk_norm(draw),
    })
    if architecture == "encoder_decoder":
        for key in ("encoder_layers", "decoder_layers"):
            config[key] = draw(st.sampled_from([None, 1, 2]))
        if features:
            _feature_source(draw, config)
    elif draw(st.integers(0, 3)) == 0:
        _layer_variants(draw, config, head_dim)
    if architecture == "encoder":
        _sentence_outputs(draw, config)
    if not config["scale_embeddings"]:
        config["embedding_scale"] = draw(st.sampled_from([None, 0.5, 12.0]))
    if architecture != "encoder" or config.get("lm_head"):
        config["logit_scale"] = draw(st.sampled_from([None, 0.125, 3.0]))
        # a cap that saturates tanh (0.5 on logits of 1 and more) makes exact float32 ties, which
        # PyTorch and onnxruntime break apart: greedy tokens would differ where the logits agree
        config["logit_softcap"] = draw(st.sampled_from([None, 2.0, 30.0]))
    return config


def _vocabularies(config: dict) -> tuple[int, int]:
    """(source, target) vocabulary sizes of a config."""
    shared = config.get("vocab_size")
    return (shared, shared) if shared else (config["src_vocab_size"], config["tgt_vocab_size"])


def _inputs(config: dict, model) -> tuple[torch.Tensor, ...]:
    src_vocab, tgt_vocab = _vocabularies(config)
    pad = config["pad_id"]
    gen = torch.Generator().manual_seed(0)
    if config.get("frontend"):  # features (batch, channels, frames) of a speech model
        ids = model.src_embed.features(torch.randn(2, 24, generator=gen)) \
            if config.get("features") else torch.randn(2, config["frontend"]["in_channels"], 6, generator=gen)
        return ids, torch.randint(0, tgt_vocab, (2, 3), generator=gen)
    ids = torch.randint(0, src_vocab, (2, 5), generator=gen)
    if pad is not None:
        ids[ids == pad] = (pad + 1) % src_vocab
        ids[1, :2] = pad  # a padded row
    if config["architecture"] == "encoder_decoder":
        tgt = torch.randint(0, tgt_vocab, (2, 3), generator=gen)
        return ids, tgt
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
    width = _vocabularies(config)[1] if config["architecture"] != "encoder" or config.get("lm_head") \
        else config["d_model"]
    assert out.shape == (2, inputs[-1].shape[1], width)
    assert torch.isfinite(out).all()
    if config["architecture"] == "encoder_decoder" and config["bos_id"] is None:
        with pytest.raises(tk.ConfigError, match="starts from bos_id"):  # nothing to start from
            model.generate(inputs[0], 3)
    elif config["architecture"] != "encoder":
        new = model.generate(inputs[0], 3)
        assert new.shape[0] == 2 and new.shape[1] <= 3
        assert ((new >= 0) & (new < _vocabularies(config)[1])).all()


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(config=valid_configs())
def test_every_valid_config_exports_and_verifies(tmp_path_factory, config):
    from transformer_kit.export import export_onnx

    torch.manual_seed(0)
    model = tk.build_model(config).eval()
    report = export_onnx(model, tmp_path_factory.mktemp("export") / "onnx")
    assert report.max_error is not None and report.max_error <= 1e-4
    assert report.traced_components == {}
    generates = config["architecture"] == "decoder" or (
        config["architecture"] == "encoder_decoder" and config["bos_id"] is not None)
    assert report.tokens_match is (True if generates else None)


# -- invalid configs ---------------------------------------------------------------------------
SIZE_KEYS = ["vocab_size", "d_model", "num_heads", "num_kv_heads", "num_layers", "d_ff", "max_len"]
BOOL_KEYS = ["tie_embeddings", "scale_embeddings", "attention_bias", "embedding_norm", "head_bias"]
KINDS_IN_CONFIG = ["attention", "positional", "mask", "block", "feedforward", "norm"]
WRONG_VALUES = ["x", 1.5, [1], {"a": 1}, None, True]


def _wrong_type(draw, config: dict, vocab: int) -> None:
    key = draw(st.sampled_from(SIZE_KEYS + BOOL_KEYS + ["dropout", "pad_id", "bos_id"]))
    value = draw(st.sampled_from(WRONG_VALUES))
    if (key in BOOL_KEYS and value is True) or (key in ("pad_id", "bos_id") and value is None):
        value = "x"
    if key == "num_kv_heads" and value is None:
        value = 1.5
    if key == "dropout" and isinstance(value, bool):
        value = "x"
    config[key] = value


def _size(draw, config: dict, vocab: int) -> None:
    config[draw(st.sampled_from(SIZE_KEYS))] = draw(st.integers(-5, 0))


def _dropout(draw, config: dict, vocab: int) -> None:
    config["dropout"] = draw(st.one_of(st.floats(1.0, 10.0), st.floats(-10.0, -1e-6),
                                       st.just(math.nan), st.just(math.inf)))


def _id(draw, config: dict, vocab: int) -> None:
    key = draw(st.sampled_from(["pad_id", "bos_id", "eos_id"]))
    config[key] = draw(st.one_of(st.integers(vocab, vocab + 50), st.integers(-20, -1)))


def _kv_heads(draw, config: dict, vocab: int) -> None:
    heads = config["num_heads"]
    config["num_kv_heads"] = draw(st.sampled_from([k for k in range(2, 9) if heads % k or k > heads]))


def _heads(draw, config: dict, vocab: int) -> None:
    config.pop("head_dim", None)  # d_model must then divide into the heads
    config["num_heads"] = draw(st.sampled_from([h for h in (3, 5, 7) if config["d_model"] % h]))


def _unknown_key(draw, config: dict, vocab: int) -> None:
    config[draw(st.sampled_from(["d_modle", "num_head", "dropuot", "vocabsize", "layers"]))] = 1


def _unknown_component(draw, config: dict, vocab: int) -> None:
    kind = draw(st.sampled_from(KINDS_IN_CONFIG))
    config[kind] = draw(st.sampled_from(["nonexistent", "Matmul", "rope", ""]))


def _unknown_param(draw, config: dict, vocab: int) -> None:
    kind = draw(st.sampled_from(["attention", "block", "norm"]))
    name = config[kind] if isinstance(config[kind], str) else config[kind]["name"]
    config[kind] = {"name": name, "no_such_param": 1}


def _architecture(draw, config: dict, vocab: int) -> None:
    config["architecture"] = draw(st.sampled_from(["decoder_only", "", "Encoder", 3]))


def _component_type(draw, config: dict, vocab: int) -> None:
    config[draw(st.sampled_from(KINDS_IN_CONFIG))] = draw(st.sampled_from([3, 1.5, ["causal"]]))


def _speech_settings(draw, config: dict, vocab: int) -> None:
    if not config.get("frontend"):  # speech settings on a model that reads no audio
        config["speech"] = {"start_of_transcript": 0}
        return
    speech = config["speech"] = dict(config.get("speech") or _speech(draw, config))
    wrong = draw(st.sampled_from(["id", "head", "width", "unknown", "missing"]))
    if wrong == "id":
        speech[draw(st.sampled_from(["end_of_text", "timestamp_begin"]))] = vocab + draw(st.integers(0, 9))
    elif wrong == "head":
        speech["alignment_heads"] = [[draw(st.integers(3, 9)), 0]]
    elif wrong == "width":
        speech["median_filter_width"] = draw(st.sampled_from([0, 2, 8]))
    elif wrong == "unknown":
        speech["alignment_head"] = [[0, 0]]
    else:
        del speech["no_timestamps"]


#: Each way to make a valid config wrong: mutation(draw, config, largest vocabulary size), in place.
MUTATIONS = {
    "wrong_type": _wrong_type, "size": _size, "dropout": _dropout, "id": _id, "kv_heads": _kv_heads,
    "unknown_key": _unknown_key, "unknown_component": _unknown_component,
    "unknown_param": _unknown_param, "heads": _heads, "architecture": _architecture,
    "component_type": _component_type, "speech": _speech_settings,
}


@st.composite
def invalid_configs(draw) -> tuple[dict, str]:
    """A valid config with one thing made wrong; returns it and what was changed."""
    config = copy.deepcopy(draw(valid_configs()))
    vocab = max(_vocabularies(config))
    mutation = draw(st.sampled_from(list(MUTATIONS)))
    MUTATIONS[mutation](draw, config, vocab)
    return config, mutation


@settings(max_examples=300, deadline=None, derandomize=True)
@given(invalid_configs())
def test_every_invalid_config_is_refused_with_a_config_error(case):
    config, mutation = case
    with pytest.raises(tk.ConfigError) as info:
        tk.build_model(config)
    message = str(info.value)
    assert message and "Traceback" not in message, mutation
