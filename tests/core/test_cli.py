"""The transformer-kit command through typer's runner, plus one real subprocess per command."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

import transformer_kit as tk
from tests.core.combinations import tiny_config
from transformer_kit.cli import app
from transformer_kit.export import OnnxModel

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A saved tiny decoder and its export, shared by the CLI tests."""
    folder = tmp_path_factory.mktemp("cli")
    torch.manual_seed(0)
    model = tk.build_model(tiny_config("decoder", attention="sdpa"))
    model.save(folder / "model")
    result = invoke("export", str(folder / "model"), "-o", str(folder / "onnx"))
    assert result.exit_code == 0, result.output
    return model, folder


def _config_file(tmp_path: Path, **overrides) -> Path:
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(tiny_config("decoder", **overrides)))
    return path


def test_components_table_lists_every_component():
    result = invoke("components")
    assert result.exit_code == 0
    for kind in tk.KINDS:
        for name in tk.get_registry().names(kind):
            assert name in result.output
    assert "built-in" in result.output
    only = invoke("components", "--kind", "norm")
    assert "rmsnorm" in only.output and "sinusoidal" not in only.output
    bad = invoke("components", "--kind", "attn")
    assert bad.exit_code == 1 and "Unknown component kind 'attn'" in bad.output


def test_components_lists_plugins_that_failed(installed_package, fresh_registry):
    installed_package("tk-broken", "tkplugin_broken_cli", "raise RuntimeError('no luck')\n")
    with pytest.warns(RuntimeWarning):
        tk.reset_registry()
    result = invoke("components", "--kind", "norm")
    assert result.exit_code == 0
    assert "not loaded" in result.output and "tkplugin_broken_cli" in result.output
    assert "tk-broken" in result.output and "no luck" in result.output


def test_config_show_validate_schema(tmp_path):
    path = _config_file(tmp_path)
    shown = invoke("config", "show", str(path))
    assert shown.exit_code == 0
    resolved = yaml.safe_load(shown.output)
    assert resolved == tk.load_config(path).to_dict()
    assert resolved["mask"] == "causal"  # a default filled in
    assert invoke("config", "validate", str(path)).exit_code == 0
    broken = _config_file(tmp_path, positional="rotery")
    result = invoke("config", "validate", str(broken))
    assert result.exit_code == 1 and "Did you mean 'rotary'" in result.output
    assert "Traceback" not in result.output
    schema = invoke("config", "schema", "-o", str(tmp_path / "schema.json"))
    assert schema.exit_code == 0
    properties = json.loads((tmp_path / "schema.json").read_text())["properties"]
    assert {"d_model", "attention", "positional"} <= set(properties)


def test_export_run_generate(exported):
    model, folder = exported
    assert json.loads((folder / "onnx" / "manifest.json").read_text())["architecture"] == "decoder"
    result = invoke("run", str(folder / "onnx"), "--ids", "5 6 7; 8 9")
    assert result.exit_code == 0, result.output
    assert "provider: CPUExecutionProvider" in result.output and "shape [2, 3, 37]" in result.output
    with torch.no_grad():
        expected = model.eval()(torch.tensor([[5, 6, 7], [8, 9, 0]])).argmax(-1).tolist()
    assert f"argmax: {expected}" in result.output
    result = invoke("generate", str(folder / "onnx"), "--ids", "5 6 7; 8 9", "--max-new-tokens", "5")
    assert result.exit_code == 0, result.output
    tokens = model.generate(torch.tensor([[5, 6, 7], [8, 9, 0]]), max_new_tokens=5).tolist()
    for row in tokens:
        assert " ".join(map(str, row)) in result.output


def test_export_from_config_with_weights_and_from_hf(tmp_path):
    import transformers

    path = _config_file(tmp_path, d_model=8, num_heads=2)
    torch.manual_seed(0)
    model = tk.build_model(path)
    from safetensors.torch import save_model

    save_model(model, str(tmp_path / "w.safetensors"))
    result = invoke("export", str(path), "--weights", str(tmp_path / "w.safetensors"),
                    "-o", str(tmp_path / "onnx"), "--dtype", "float16")
    assert result.exit_code == 0, result.output
    assert "float16" in result.output and "passed" in result.output
    ids = torch.tensor([[4, 5, 6]])
    with torch.no_grad():
        expected = model.eval()(ids).numpy()
    actual = OnnxModel(tmp_path / "onnx")(ids.numpy())
    assert abs(actual.astype("float64") - expected).max() / abs(expected).max() < 2e-2
    wrong = invoke("export", str(path), "--weights", str(tmp_path / "missing.safetensors"), "-o",
                   str(tmp_path / "x"))
    assert wrong.exit_code == 1 and "Cannot load weights" in wrong.output

    checkpoint = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=40, n_positions=16, n_embd=8, n_layer=1, n_head=2, bos_token_id=1,
        eos_token_id=2)).save_pretrained(checkpoint)
    shown = invoke("config", "show", str(checkpoint))
    assert shown.exit_code == 0 and yaml.safe_load(shown.output)["block"] == "pre_norm"
    result = invoke("export", str(checkpoint), "--from-hf", "-o", str(tmp_path / "hf-onnx"),
                    "--quantize", "int8")
    assert result.exit_code == 0, result.output
    assert "int8" in result.output


def test_errors_are_one_line_unless_debug(tmp_path):
    result = invoke("generate", str(tmp_path / "nope"), "--ids", "1 2")
    assert result.exit_code == 1
    assert "manifest.json is missing" in result.output and "Traceback" not in result.output
    debug = invoke("--debug", "generate", str(tmp_path / "nope"), "--ids", "1 2")
    assert isinstance(debug.exception, tk.ExportError)
    bad_ids = invoke("generate", str(tmp_path), "--ids", "1 x")
    assert bad_ids.exit_code == 2 and "is not token ids" in bad_ids.output


def test_bench_reports_both_runtimes(exported):
    _, folder = exported
    result = invoke("bench", str(folder / "model"), "--new-tokens", "4", "--prompt-len", "4",
                    "--rounds", "1", "-o", str(folder / "onnx"))
    assert result.exit_code == 0, result.output
    assert "transformer-kit, PyTorch eager" in result.output
    assert "transformer-kit, onnxruntime (CPU)" in result.output
    assert "1.00x" in result.output  # the baseline row
    assert "share of bandwidth bound" in result.output and "GB/s" in result.output


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_plots(tmp_path, exported):
    _, folder = exported
    result = invoke("plot", "positional", "-o", str(tmp_path / "pe.png"))
    assert result.exit_code == 0, result.output
    width, height = _png_size(tmp_path / "pe.png")
    assert width > height > 100
    result = invoke("plot", "attention", str(folder / "model"), "--ids", "5 6 7 8",
                    "-o", str(tmp_path / "attn"))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "attn").iterdir()) == [
        "decoder_layers_0_self_attention.png", "decoder_layers_1_self_attention.png"]


def test_attention_capture_matches_the_seed_weights():
    from transformer_kit.plotting import capture_attention, positional_matrix

    model = tk.build_model(tiny_config("decoder"))
    with torch.no_grad(), capture_attention(model) as records:
        model(torch.tensor([[5, 6, 7, 0]]))
    assert [name for name, _ in records] == ["decoder.layers.0.self_attention",
                                             "decoder.layers.1.self_attention"]
    weights = records[0][1]
    assert weights.shape == (1, 4, 4, 4)
    torch.testing.assert_close(weights.sum(-1)[0, :, :3], torch.ones(4, 3))
    assert torch.equal(weights[0, :, :, 3], torch.zeros(4, 4))  # the padding key
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))  # causal
    matrix, _ = positional_matrix("sinusoidal", 50, 128)
    assert matrix.shape == (50, 128) and matrix[1, 0].item() == pytest.approx(0.841471, abs=1e-5)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "transformer_kit", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=600, check=False)


def test_every_command_in_a_real_process(tmp_path, exported):
    _, folder = exported
    calls = [
        (["--help"], "components"),
        (["components", "--kind", "block"], "pre_norm"),
        (["config", "show", str(folder / "model")], "architecture: decoder"),
        (["config", "validate", str(folder / "model")], "valid"),
        (["config", "schema"], '"properties"'),
        (["export", str(folder / "model"), "-o", str(tmp_path / "onnx")], "passed"),
        (["run", str(tmp_path / "onnx"), "--ids", "5 6 7"], "argmax"),
        (["generate", str(tmp_path / "onnx"), "--ids", "5 6 7", "--max-new-tokens", "3"], "tokens/s"),
        (["bench", str(folder / "model"), "--new-tokens", "2", "--prompt-len", "3", "--rounds", "1",
          "-o", str(tmp_path / "onnx")], "vs PyTorch eager"),
        (["plot", "positional", "-o", str(tmp_path / "pe.png")], "wrote"),
        (["plot", "attention", str(folder / "model"), "--ids", "5 6", "-o", str(tmp_path / "a")], "wrote"),
    ]
    for args, expected in calls:
        result = _cli(*args, cwd=tmp_path)
        assert result.returncode == 0, (args, result.stderr[-2000:])
        assert expected in result.stdout, (args, result.stdout[-2000:])
    failed = _cli("run", str(tmp_path / "missing"), "--ids", "1", cwd=tmp_path)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "manifest.json is missing" in failed.stderr


def test_demo_solves_the_task(tmp_path):
    result = _cli("demo", "-o", str(tmp_path / "demo"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    line = next(li for li in result.stdout.splitlines() if "accuracy on 500 unseen" in li)
    accuracies = [float(x.rstrip("%,;")) for x in line.replace("%", "% ").split() if x[0].isdigit()]
    assert accuracies[1] >= 99.0 and accuracies[2] >= 99.0
    assert (tmp_path / "demo" / "onnx" / "manifest.json").exists()
    assert (tmp_path / "demo" / "model" / "model.safetensors").exists()


def test_config_show_of_a_folder_with_a_damaged_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    result = invoke("config", "show", str(tmp_path))
    assert result.exit_code == 1 and "is not valid JSON" in result.output
    assert "Traceback" not in result.output
