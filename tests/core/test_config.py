"""Config validation: files, defaults, and refusals that name the key and what is allowed."""

from __future__ import annotations

import json

import pytest
import yaml

import transformer_kit as tk
from transformer_kit.core.config import ModelConfig


def test_defaults_are_the_paper():
    cfg = tk.load_config({"vocab_size": 37000})
    assert (cfg.d_model, cfg.num_heads, cfg.num_layers, cfg.d_ff) == (512, 8, 6, 2048)
    assert cfg.head_dim is None and cfg.attention_head_dim == 64
    optional = ("qk_norm", "pooling", "frontend", "features")
    assert [cfg.component(k).name for k in tk.MODEL_KINDS if k not in optional] == [
        "matmul", "sinusoidal", "causal", "post_norm", "relu", "layernorm"]
    assert cfg.qk_norm is None and "qk_norm" not in cfg.components()
    assert cfg.pooling is None and "pooling" not in cfg.components()
    assert cfg.frontend is None and cfg.features is None and cfg.encoder_positional is None
    assert cfg.speech is None
    assert tk.load_config({"architecture": "encoder", "vocab_size": 9}).mask.name == "none"


def test_yaml_json_and_dict_give_the_same_config(tmp_path):
    data = {"architecture": "decoder", "vocab_size": 100, "d_model": 64, "num_heads": 4,
            "num_kv_heads": 2, "positional": {"name": "rotary", "base": 500000.0},
            "mask": {"name": "sliding_window", "window": 16}, "feedforward": "swiglu"}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "m.json").write_text(json.dumps(data))
    from_dict = tk.load_config(data)
    assert tk.load_config(tmp_path / "m.yaml") == from_dict
    assert tk.load_config(str(tmp_path / "m.json")) == from_dict
    assert from_dict.positional.params == {"base": 500000.0}
    assert tk.load_config(from_dict.to_dict()) == from_dict
    assert from_dict.to_dict()["positional"] == {"name": "rotary", "base": 500000.0}


def test_build_model_reads_a_yaml_file(tmp_path):
    path = tmp_path / "model.yml"
    path.write_text("architecture: encoder\nvocab_size: 11\nd_model: 8\nnum_heads: 2\n"
                    "num_layers: 1\nd_ff: 16\n")
    assert tk.build_model(path).config.d_model == 8


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"d_modle": 8}, "unknown key 'd_modle'. Did you mean 'd_model'?"),
        ({"d_model": 0}, "key 'd_model': Input should be greater than 0"),
        ({"d_model": "512"}, "key 'd_model': Input should be a valid integer"),
        ({"dropout": 1.0}, "key 'dropout': Input should be less than 1"),
        ({"dropout": -0.1}, "key 'dropout': Input should be greater than or equal to 0"),
        ({"num_heads": 3}, "'d_model' (512) must be divisible by 'num_heads' (3)"),
        ({"num_kv_heads": 3}, "'num_kv_heads' (3) must divide 'num_heads' (8)"),
        ({"num_kv_heads": 16}, "'num_kv_heads' (16) must divide"),
        ({"eos_id": 10}, "'eos_id' (10) must be below the vocabulary size (10)"),
        ({"architecture": "seq2seq"}, "key 'architecture': Input should be 'encoder_decoder'"),
        ({"src_vocab_size": 5}, "give either 'vocab_size' or"),
        ({"lm_head": True}, "'lm_head' applies to encoder models"),
        ({"attention": {"nam": "sdpa"}}, "key 'attention.name'"),
        ({"attention": 5}, "attention"),
    ],
)
def test_bad_values_are_refused_with_the_key(overrides, message):
    with pytest.raises(tk.ConfigError) as info:
        tk.load_config({"vocab_size": 10, **overrides})
    assert message in str(info.value)


def test_architecture_specific_keys():
    with pytest.raises(tk.ConfigError, match=r"'vocab_size' is required for architecture 'decoder'"):
        tk.load_config({"architecture": "decoder"})
    with pytest.raises(tk.ConfigError, match=r"'encoder_layers' applies to encoder_decoder only"):
        tk.load_config({"architecture": "decoder", "vocab_size": 5, "encoder_layers": 2})
    with pytest.raises(tk.ConfigError, match=r"both 'src_vocab_size' and 'tgt_vocab_size'"):
        tk.load_config({"src_vocab_size": 5})


def test_unknown_component_names_list_what_is_registered():
    with pytest.raises(tk.UnknownComponentError) as info:
        tk.build_model({"vocab_size": 10, "positional": "rotery"})
    text = str(info.value)
    assert "config key 'positional'" in text and "Did you mean 'rotary'?" in text
    assert "alibi, learned, none, relative_bias, rotary, sinusoidal" in text


def test_bad_component_params_name_the_component():
    with pytest.raises(tk.ConfigError, match=r"mask 'sliding_window'.*unknown parameter 'size'"):
        tk.build_model({"architecture": "decoder", "vocab_size": 10, "d_model": 8, "num_heads": 2,
                        "mask": {"name": "sliding_window", "size": 3}})
    with pytest.raises(tk.ConfigError, match=r"positional: positional 'rotary'.*even"):
        tk.build_model({"architecture": "decoder", "vocab_size": 10, "d_model": 10, "num_heads": 2,
                        "positional": "rotary"})


def test_a_decoder_needs_a_causal_mask():
    with pytest.raises(tk.ConfigError, match=r"mask 'none' is not causal.*causal, sliding_window"):
        tk.build_model({"architecture": "decoder", "vocab_size": 10, "mask": "none"})


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("empty.yaml", "", "is empty"),
        ("blank.json", "  \n", "is empty"),
        ("bad.yaml", "vocab_size: [1, 2\n", "is not valid YAML at line 2, column 1: expected ','"),
        ("tab.yaml", "vocab_size: 3\n\td_model: 8\n", "at line 2, column 1: a tab character.*spaces"),
        ("bad.json", "{\"vocab_size\": }", "is not valid JSON at line 1, column 16: Expecting value"),
        ("list.yaml", "- 1\n- 2\n", "holds a list"),
        ("model.toml", "vocab_size = 3", "use .yaml, .yml or .json"),
    ],
)
def test_bad_files_are_refused(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(tk.ConfigError, match=message) as info:
        tk.load_config(path)
    assert "\n" not in str(info.value) and "<unicode string>" not in str(info.value)
    assert name in str(info.value)


def test_missing_file_and_non_mapping():
    with pytest.raises(tk.ConfigError, match=r"'/no/such/config.yaml' does not exist"):
        tk.load_config("/no/such/config.yaml")
    with pytest.raises(tk.ConfigError, match=r"mapping"):
        tk.load_config(["vocab_size", 3])


def test_config_is_immutable():
    cfg = ModelConfig(vocab_size=10)
    with pytest.raises(Exception, match=r"frozen"):
        cfg.d_model = 3


def test_head_dim_sets_each_head_s_width_apart_from_d_model():
    """Heads of another width than d_model / num_heads (T5's d_kv, Mistral Nemo's head_dim):
    d_model need not divide then, and the model generates as with any config."""
    import torch

    config = {"architecture": "decoder", "vocab_size": 37, "d_model": 18, "num_heads": 4,
              "num_kv_heads": 2, "head_dim": 6, "num_layers": 1, "d_ff": 24, "positional": "rotary"}
    model = tk.build_model(config).eval()
    attention = model.decoder.layers[0].self_attention
    assert (attention.q_proj.out_features, attention.k_proj.out_features) == (24, 12)
    assert attention.o_proj.in_features == 24 and model.config.attention_head_dim == 6
    ids = torch.tensor([[3, 4, 5, 6]])
    cached = model.generate(ids, max_new_tokens=5)
    assert torch.equal(cached, model.generate(ids, max_new_tokens=5, use_cache=False))
    with pytest.raises(tk.ConfigError, match=r"divisible by 'num_heads'.*or give 'head_dim'"):
        tk.load_config({**config, "head_dim": None})


@pytest.mark.parametrize("overrides, message", [
    ({"architecture": "decoder", "pooling": "mean"}, "'pooling' apply to encoder models only"),
    ({"architecture": "encoder", "sentence_embedding": {"normalize": True}},
     "'sentence_embedding' follows pooling"),
    ({"architecture": "encoder", "pooling": "mean", "classifier": {"num_labels": 1}},
     "exclude each other"),
    ({"architecture": "encoder", "lm_head": True, "classifier": {}}, "'lm_head' and a sentence output"),
    ({"architecture": "encoder", "pooling": "mean",
      "sentence_embedding": {"dense": [{"in_features": 7, "out_features": 3}]}},
     "layer 0 takes 7 features but pooling gives d_model (16)"),
    ({"architecture": "encoder", "pooling": "mean",
      "sentence_embedding": {"dense": [{"in_features": 16, "out_features": 3},
                                       {"in_features": 4, "out_features": 2}]}},
     "layer 1 takes 4 features but layer 0 gives 3"),
    ({"architecture": "encoder", "pooling": "mean",
      "sentence_embedding": {"default_prompt_name": "query"}}, "'query' is not one of the prompts"),
    ({"architecture": "encoder", "classifier": {"num_labels": 2, "labels": ["a"]}}, "names 1 labels"),
    ({"architecture": "encoder", "pooling": "mean",
      "sentence_embedding": {"dense": [{"in_features": 16, "out_features": 3, "activation": "swish"}]}},
     "sentence_embedding.dense.0.activation"),
    ({"architecture": "encoder", "pooling": "meen"}, "Did you mean 'mean'"),
])
def test_sentence_outputs_are_checked(overrides, message):
    with pytest.raises(tk.ConfigError) as info:
        tk.build_model({"vocab_size": 10, "d_model": 16, "num_heads": 2, **overrides})
    assert message in str(info.value)


def test_sentence_outputs_round_trip():
    config = tk.load_config({
        "architecture": "encoder", "vocab_size": 10, "d_model": 16, "num_heads": 2,
        "pooling": {"name": "mean"}, "max_seq_length": 32, "lowercase": True,
        "sentence_embedding": {"normalize": True, "prompts": {"query": "q: "},
                               "dense": [{"in_features": 16, "out_features": 8}]}})
    assert tk.load_config(config.to_dict()) == config
    assert config.to_dict()["sentence_embedding"]["dense"][0]["activation"] == "tanh"
