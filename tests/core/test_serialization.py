"""model.save / tk.load_model: config plus safetensors weights, exact round trip."""

from __future__ import annotations

import json

import pytest
import torch

import transformer_kit as tk
from tests.combinations import tiny_config


@pytest.mark.parametrize("architecture", ["encoder_decoder", "decoder", "encoder"])
def test_round_trip_gives_identical_outputs(tmp_path, architecture):
    torch.manual_seed(0)
    config = tiny_config(architecture, positional={"name": "rotary", "base": 1000.0},
                         tie_embeddings=True)
    model = tk.build_model(config).eval()
    model.save(tmp_path / "m")
    loaded = tk.load_model(tmp_path / "m").eval()
    assert loaded.config == model.config
    ids = torch.randint(3, 37, (2, 5))
    args = (ids, ids[:, :3]) if architecture == "encoder_decoder" else (ids,)
    assert torch.equal(loaded(*args), model(*args))
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["config"]["positional"] == {"name": "rotary", "base": 1000.0}


def test_tied_weights_stay_tied_after_loading(tmp_path):
    model = tk.build_model(tiny_config("decoder", tie_embeddings=True))
    model.save(tmp_path)
    loaded = tk.load_model(tmp_path)
    assert loaded.head.weight is loaded.embed.token.weight


def test_missing_or_mismatched_weights(tmp_path):
    model = tk.build_model(tiny_config("decoder"))
    model.save(tmp_path / "m")
    with pytest.raises(tk.CheckpointError, match=r"model.safetensors is missing"):
        (tmp_path / "m" / "model.safetensors").rename(tmp_path / "elsewhere")
        tk.load_model(tmp_path / "m")
    bigger = tk.build_model(tiny_config("decoder", d_model=32))
    bigger.save(tmp_path / "b")
    (tmp_path / "b" / "model.safetensors").replace(tmp_path / "m" / "model.safetensors")
    with pytest.raises(tk.CheckpointError, match=r"Cannot load weights"):
        tk.load_model(tmp_path / "m")
    with pytest.raises(tk.CheckpointError, match=r"'.*nothing-here' does not exist"):
        tk.load_model(tmp_path / "nothing-here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(tk.CheckpointError, match=r"config.json is missing"):
        tk.load_model(tmp_path / "empty")


def test_a_damaged_config_file_is_a_typed_error(tmp_path):
    tk.build_model(tiny_config("decoder")).save(tmp_path)
    (tmp_path / "config.json").write_bytes(b"\xff\xfe not text")
    with pytest.raises(tk.CheckpointError, match=r"is not valid JSON.*Save the model again"):
        tk.load_model(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(tk.CheckpointError, match="does not hold a JSON object"):
        tk.load_model(tmp_path)
