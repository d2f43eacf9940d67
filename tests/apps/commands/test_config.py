"""transformer-kit config show|validate|schema, on every kind of source."""

from __future__ import annotations

import json

import jsonschema
import yaml

import transformer_kit as tk
from tests.apps.conftest import cli, config_file, invoke
from transformer_kit.core.assembly import check_config


def test_show_fills_in_defaults_and_validate_accepts(tmp_path):
    path = config_file(tmp_path)
    shown = invoke("config", "show", str(path))
    assert shown.exit_code == 0
    resolved = yaml.safe_load(shown.output)
    assert resolved == tk.load_config(path).to_dict()
    assert resolved["mask"] == "causal"  # a default filled in
    valid = invoke("config", "validate", str(path))
    assert valid.exit_code == 0
    model = tk.build_model(path)
    assert f"{sum(p.numel() for p in model.parameters()):,} parameters" in valid.output


def test_validate_checks_component_parameters_as_build_model_does(tmp_path):
    misspelt = config_file(tmp_path, positional={"name": "rotary", "bsae": 5e5})
    result = invoke("config", "validate", str(misspelt))
    assert result.exit_code == 1, result.output
    assert "unknown parameter 'bsae'" in result.output and "Did you mean 'base'" in result.output
    out_of_range = config_file(tmp_path, positional={"name": "rotary", "base": 0.5})
    result = invoke("config", "validate", str(out_of_range))
    assert result.exit_code == 1 and "base must be greater than 1" in result.output
    broken = config_file(tmp_path, positional="rotery")
    result = invoke("config", "validate", str(broken))
    assert result.exit_code == 1 and "Did you mean 'rotary'" in result.output
    assert "Traceback" not in result.output


def test_validate_refuses_a_model_too_large_to_build_without_allocating_it(tmp_path):
    huge = config_file(tmp_path, vocab_size=100_000_000_000, d_model=512)
    result = invoke("config", "validate", str(huge))
    assert result.exit_code == 0, result.output  # valid: it only would not fit here
    size = check_config(tk.load_config(huge))  # counted on the meta device
    assert size.parameters > 2 * 100_000_000_000 * 512  # token table and untied head
    assert f"{size.parameters:,} parameters" in result.output
    assert "warning" in result.output and "would be refused" in result.output
    result = invoke("export", str(huge), "-o", str(tmp_path / "x"))
    assert result.exit_code == 1 and "more than the" in result.output and "available" in result.output


def test_schema_is_the_config_schema_and_accepts_the_shipped_configs(tmp_path):
    schema = invoke("config", "schema", "-o", str(tmp_path / "schema.json"))
    assert schema.exit_code == 0
    written = json.loads((tmp_path / "schema.json").read_text())
    assert written == tk.ModelConfig.model_json_schema()
    jsonschema.validate(yaml.safe_load(config_file(tmp_path).read_text()), written)


def test_show_reads_exports_and_says_what_a_path_is(tmp_path, exported):
    model, folder = exported
    shown = invoke("config", "show", str(folder / "onnx"))
    assert shown.exit_code == 0, shown.output
    assert yaml.safe_load(shown.output) == model.config.to_dict()
    missing = invoke("config", "show", str(tmp_path / "nowhere"))
    assert missing.exit_code == 1 and "does not exist" in missing.output
    (tmp_path / "empty").mkdir()
    other = invoke("config", "show", str(tmp_path / "empty"))
    assert other.exit_code == 1 and "neither a config file nor a model folder" in other.output


def test_show_of_a_folder_with_a_damaged_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    result = invoke("config", "show", str(tmp_path))
    assert result.exit_code == 1 and "is not valid JSON" in result.output
    assert "Traceback" not in result.output


def test_a_yaml_file_with_a_tab_is_one_line_naming_file_and_line(tmp_path):
    path = tmp_path / "tabbed.yaml"
    path.write_text("architecture: decoder\nvocab_size: 37\n\td_model: 16\n")
    result = invoke("config", "validate", str(path))
    assert result.exit_code == 1
    message = result.output.strip()
    assert "\n" not in message and "<unicode string>" not in message
    assert "tabbed.yaml" in message and "line 3" in message and "spaces" in message


def test_config_commands_in_a_real_process(tmp_path, exported):
    _, folder = exported
    for args, expected in [(["config", "show", str(folder / "model")], "architecture: decoder"),
                           (["config", "validate", str(folder / "model")], "valid"),
                           (["config", "schema"], '"properties"')]:
        result = cli(*args, cwd=tmp_path)
        assert result.returncode == 0, (args, result.stderr)
        assert expected in result.stdout


def test_show_and_validate_read_a_gguf_file_by_its_hub_name(tmp_path, monkeypatch):
    import torch
    import transformers as hf

    from tests.checkpoints.gguf.writer import write_gguf
    from tests.checkpoints.hub_cache import place_snapshot

    torch.manual_seed(0)
    model = hf.Qwen3ForCausalLM(hf.Qwen3Config(
        vocab_size=40, hidden_size=32, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=1, num_hidden_layers=1, head_dim=16, max_position_embeddings=32,
        bos_token_id=1, eos_token_id=2))
    path = write_gguf(model, tmp_path / "tiny-F32.gguf", "qwen3")
    place_snapshot(tmp_path / "cache", "org/tiny-GGUF", path, "d" * 40, refs=("main", "v1"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    shown = invoke("config", "show", "org/tiny-GGUF:tiny-F32.gguf", "--revision", "v1")
    assert shown.exit_code == 0, shown.output
    assert yaml.safe_load(shown.output) == tk.config_from_gguf(path).to_dict()
    valid = invoke("config", "validate", "org/tiny-GGUF:tiny-F32.gguf")
    assert valid.exit_code == 0 and "valid:" in valid.output
    absent = invoke("config", "show", "org/tiny-GGUF:other.gguf")
    assert absent.exit_code == 1 and "Traceback" not in absent.output
    assert "file 'other.gguf' of Hub repository 'org/tiny-GGUF'" in absent.output
