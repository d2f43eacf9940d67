"""transformer-kit export: every kind of source, the options as flags, and the loud warning
when a config file is exported without weights."""

from __future__ import annotations

import json

import onnx
import pytest
import torch
import transformers

import transformer_kit as tk
from tests.apps.conftest import cli, config_file, invoke
from transformer_kit.runtime import OnnxModel


def test_export_of_a_saved_model(exported):
    _, folder = exported
    manifest = json.loads((folder / "onnx" / "manifest.json").read_text())
    assert manifest["architecture"] == "decoder" and manifest["verification"]["tolerance"] == 1e-4


def test_export_of_a_config_with_weights_in_float16(tmp_path):
    path = config_file(tmp_path, d_model=8, num_heads=2)
    torch.manual_seed(0)
    model = tk.build_model(path).eval()
    from safetensors.torch import save_model

    save_model(model, str(tmp_path / "w.safetensors"))
    result = invoke("export", str(path), "--weights", str(tmp_path / "w.safetensors"),
                    "-o", str(tmp_path / "onnx"), "--dtype", "float16")
    assert result.exit_code == 0, result.output
    assert "float16" in result.output and "passed" in result.output and "warning" not in result.output
    ids = torch.tensor([[4, 5, 6]])
    with torch.no_grad():
        expected = model(ids).numpy()
    actual = OnnxModel(tmp_path / "onnx")(ids.numpy())
    assert abs(actual.astype("float64") - expected).max() / abs(expected).max() < 2e-2
    wrong = invoke("export", str(path), "--weights", str(tmp_path / "missing.safetensors"), "-o",
                   str(tmp_path / "x"))
    assert wrong.exit_code == 1 and "missing.safetensors' does not exist" in wrong.output


def test_a_config_without_weights_is_exported_with_a_loud_warning(tmp_path):
    result = invoke("export", str(config_file(tmp_path)), "-o", str(tmp_path / "onnx"))
    assert result.exit_code == 0, result.output
    assert "warning:" in result.output and "randomly initialised weights" in result.output
    assert "--weights" in result.output


@pytest.mark.parametrize(("args", "flag"), [
    (["--quantize", "int3"], "--quantize"), (["--dtype", "float64"], "--dtype"),
    (["--block-size", "32"], "--block-size"), (["--float-head"], "--float-head"),
    (["--quantize", "int4", "--block-size", "24"], "--block-size"),
    (["--quantize", "int4", "--accuracy-level", "7"], "--accuracy-level"),
    (["--opset", "30"], "--opset"), (["--quantize", "int8", "--dtype", "float16"], "--quantize"),
    (["--eos-id", "x"], "--eos-id"), (["--pad-id", "-3"], "--pad-id"),
])
def test_bad_options_are_named_by_their_flag(tmp_path, args, flag):
    result = invoke("export", str(config_file(tmp_path)), "-o", str(tmp_path / "o"), *args)
    assert result.exit_code == 2, result.output
    assert flag in result.output
    assert "quantize=" not in result.output and "dtype=" not in result.output


def _small_gpt2(folder, **config):
    torch.manual_seed(0)
    config = {"vocab_size": 1000, "n_positions": 16, "n_embd": 8, "n_layer": 1, "n_head": 2, **config}
    transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).save_pretrained(folder)
    return folder


def test_from_hf_with_int8_and_special_id_overrides(tmp_path):
    checkpoint = _small_gpt2(tmp_path / "gpt2")  # bos and eos 50256: outside its 1000 tokens
    shown = invoke("config", "show", str(checkpoint))
    assert shown.exit_code == 0 and "block: pre_norm" in shown.output
    result = invoke("export", str(checkpoint), "--from-hf", "-o", str(tmp_path / "int8"),
                    "--quantize", "int8")
    assert result.exit_code == 0, result.output
    assert "int8" in result.output
    manifest = OnnxModel(tmp_path / "int8").manifest
    assert (manifest.bos_id, manifest.eos_id) == (None, None)
    result = invoke("export", str(checkpoint), "--from-hf", "-o", str(tmp_path / "ids"),
                    "--eos-id", "7", "--pad-id", "0", "--bos-id", "none")
    assert result.exit_code == 0, result.output
    manifest = OnnxModel(tmp_path / "ids").manifest
    assert (manifest.pad_id, manifest.bos_id, manifest.eos_id) == (0, None, 7)


def test_a_gguf_file_is_exported_with_its_tokenizer(tmp_path):
    from tests.checkpoints.gguf.writer import write_gguf

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=1, num_hidden_layers=1, max_position_embeddings=32,
        bos_token_id=1, eos_token_id=2)).eval()
    path = write_gguf(model, tmp_path / "tiny.gguf", "llama")
    shown = invoke("config", "show", str(path))
    assert shown.exit_code == 0 and "num_kv_heads: 1" in shown.output, shown.output
    result = invoke("export", str(path), "-o", str(tmp_path / "onnx"), "--pad-id", "0")
    assert result.exit_code == 0, result.output
    onnx_model = OnnxModel(tmp_path / "onnx")
    assert (tmp_path / "onnx" / "tokenizer.json").is_file() and onnx_model.manifest.eos_id == 2
    ids = torch.randint(3, 59, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=ids).logits.numpy()
    assert abs(onnx_model(ids.numpy()) - expected).max() <= 1e-4 * abs(expected).max()
    wrong = invoke("export", str(path), "--from-hf", "-o", str(tmp_path / "x"))
    assert wrong.exit_code == 1 and "is a GGUF file (read without --from-hf)" in wrong.output


def test_int4_options_reach_the_graph(tmp_path):
    checkpoint = _small_gpt2(tmp_path / "gpt2", n_embd=32)
    result = invoke("export", str(checkpoint), "--from-hf", "-o", str(tmp_path / "int4"),
                    "--quantize", "int4", "--block-size", "16", "--float-head", "--float-embedding",
                    "--rounding", "nearest", "--eight-bit", "down")
    assert result.exit_code == 0, result.output
    assert "int4" in result.output and "top-1 agreement" in result.output
    manifest = OnnxModel(tmp_path / "int4").manifest
    assert manifest.quantization == "int4"
    assert manifest.quantization_options == {"method": "int4", "block_size": 16, "accuracy_level": 4,
                                             "symmetric": True, "head": False, "embedding": False,
                                             "rounding": "nearest", "eight_bit": ["down"],
                                             "calibration": None, "search_factors": []}
    float_head = _nbits_blocks(tmp_path / "int4" / "decoder_step.onnx")
    assert set(float_head) == {16}
    # one layer: its feed-forward output projection in 8 bits, the rest in 4
    assert sorted(_nbits_bits(tmp_path / "int4" / "decoder_step.onnx")) == [4] * (len(float_head) - 1) + [8]
    result = invoke("export", str(checkpoint), "--from-hf", "-o", str(tmp_path / "int4-head"),
                    "--quantize", "int4", "--block-size", "16", "--eight-bit", "none", "--symmetric")
    assert result.exit_code == 0, result.output
    assert len(_nbits_blocks(tmp_path / "int4-head" / "decoder_step.onnx")) == len(float_head) + 1
    assert set(_nbits_bits(tmp_path / "int4-head" / "decoder_step.onnx")) == {4}
    options = OnnxModel(tmp_path / "int4-head").manifest.quantization_options
    assert options["eight_bit"] == [] and options["symmetric"] is True


def test_the_calibration_flag(tmp_path):
    checkpoint = _small_gpt2(tmp_path / "gpt2", n_embd=32)  # no tokenizer
    plain = invoke("export", str(checkpoint), "--from-hf", "-o", str(tmp_path / "none"), "--quantize", "int4",
                   "--block-size", "16", "--calibration", "none", "--no-verify")
    assert plain.exit_code == 0, plain.output
    assert OnnxModel(tmp_path / "none").manifest.quantization_options["calibration"] is None
    missing = invoke("export", str(checkpoint), "--from-hf", "-o", str(tmp_path / "x"), "--quantize", "int4",
                     "--calibration", str(tmp_path / "missing.txt"))
    assert missing.exit_code == 2 and "--calibration" in missing.output and "does not exist" in missing.output
    text = tmp_path / "text.txt"
    text.write_text("some calibration text")
    untokenized = invoke("export", str(checkpoint), "--from-hf", "-o", str(tmp_path / "y"), "--quantize",
                         "int4", "--calibration", str(text))
    assert untokenized.exit_code == 1 and "needs the model's tokenizer" in untokenized.output
    assert not (tmp_path / "y").exists()


@pytest.mark.parametrize(("flags", "hint"), [(["--eight-bit", "attention"], "--eight-bit"),
                                             (["--rounding", "gptq"], "--rounding")])
def test_bad_int4_flags_say_what_is_allowed(tmp_path, flags, hint):
    checkpoint = _small_gpt2(tmp_path / "gpt2", n_embd=32)
    result = invoke("export", str(checkpoint), "--from-hf", "-o", str(tmp_path / "x"), "--quantize", "int4",
                    *flags)
    assert result.exit_code == 2 and hint in result.output and flags[1] in result.output, result.output
    assert "choose" in result.output or "among" in result.output


def _nbits_blocks(path) -> list[int]:
    """The block size of every MatMulNBits node of the graph at ``path``."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return [a.i for n in graph.node if n.op_type == "MatMulNBits" for a in n.attribute
            if a.name == "block_size"]


def _nbits_bits(path) -> list[int]:
    """The bits of every MatMulNBits node of the graph at ``path``."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return [a.i for n in graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "bits"]


def test_sources_of_the_wrong_kind_say_what_they_are(tmp_path, exported):
    _, folder = exported
    result = invoke("export", str(folder / "onnx"), "-o", str(tmp_path / "x"))
    assert result.exit_code == 1 and "is an export folder" in result.output
    checkpoint = _small_gpt2(tmp_path / "gpt2")
    result = invoke("export", str(checkpoint), "-o", str(tmp_path / "x"))
    assert result.exit_code == 1 and "Add --from-hf" in result.output
    result = invoke("export", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "x"))
    assert result.exit_code == 1 and "does not exist" in result.output


def test_export_in_a_real_process(tmp_path, exported):
    _, folder = exported
    result = cli("export", str(folder / "model"), "-o", str(tmp_path / "onnx"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "passed" in result.stdout
    # the process ends without Python's teardown: the report's last line is out, the folder whole
    assert result.stdout.splitlines()[-1].strip().startswith("export ")
    assert (tmp_path / "onnx" / "manifest.json").exists() and not list(tmp_path.glob(".*onnx*"))


def test_a_hub_name_exports_offline_from_the_cache(tmp_path, monkeypatch):
    import yaml

    from tests.chat.checkpoint import write_chat_checkpoint
    from tests.checkpoints.hub_cache import place_snapshot

    checkpoint = write_chat_checkpoint(tmp_path / "chat", layers=1)
    place_snapshot(tmp_path / "cache", "org/chat", checkpoint, "c" * 40, refs=("main", "v1"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    result = invoke("export", "org/chat", "--revision", "v1", "-o", str(tmp_path / "onnx"))
    assert result.exit_code == 0, result.output
    assert "passed" in result.output
    manifest = OnnxModel(tmp_path / "onnx").manifest
    assert manifest.tokenizer and tk.load_config(manifest.config) == tk.config_from_hf(checkpoint)
    shown = invoke("config", "show", "org/chat")
    assert shown.exit_code == 0, shown.output
    assert yaml.safe_load(shown.output) == tk.config_from_hf(checkpoint).to_dict()
    missing = invoke("export", "org/unknown", "-o", str(tmp_path / "x"))
    assert missing.exit_code == 1 and "Traceback" not in missing.output
    assert "'org/unknown' (revision main) is not a local path and not in the Hub cache" in missing.output
    local = invoke("export", "chat", "--from-hf", "--revision", "v1", "-o", str(tmp_path / "x"))
    assert local.exit_code == 1 and "is a local path" in local.output


def test_a_lora_adapter_is_merged_at_export(tmp_path):
    from tests.checkpoints.test_lora import _adapter, _ids, _llama
    from transformer_kit.export.verify import relative_error

    reference = _adapter(_llama(tmp_path / "base"), tmp_path / "adapter")
    result = invoke("export", str(tmp_path / "base"), "--adapter", str(tmp_path / "adapter"),
                    "-o", str(tmp_path / "onnx"))
    assert result.exit_code == 0, result.output
    with torch.no_grad():
        expected = reference(input_ids=_ids()).logits.numpy()
    assert relative_error(OnnxModel(tmp_path / "onnx")(_ids().numpy()), expected) <= 1e-4
    apart = invoke("export", str(tmp_path / "base"), "--adapter", f"tuned={tmp_path / 'adapter'}",
                   "-o", str(tmp_path / "apart"))
    assert apart.exit_code == 0, apart.output
    om = OnnxModel(tmp_path / "apart")
    assert om.adapters == ["tuned"]
    assert relative_error(om(_ids().numpy(), adapter="tuned"), expected) <= 1e-4
    twice = invoke("export", str(tmp_path / "base"), "--adapter", str(tmp_path / "adapter"), "--adapter",
                   str(tmp_path / "adapter"), "-o", str(tmp_path / "x"))
    assert twice.exit_code == 2 and "name the others (NAME=DIR)" in twice.output, twice.output
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(
        {**json.loads((tmp_path / "adapter" / "adapter_config.json").read_text()), "use_dora": True}))
    refused = invoke("export", str(tmp_path / "base"), "--adapter", str(tmp_path / "adapter"),
                     "-o", str(tmp_path / "dora"))
    assert refused.exit_code == 1 and "use_dora=True is not supported" in refused.output, refused.output
    gguf = invoke("export", str(tmp_path / "nope.gguf"), "--adapter", str(tmp_path / "adapter"),
                  "-o", str(tmp_path / "x"))
    assert gguf.exit_code == 1 and "does not exist; give a Hugging Face checkpoint folder with " \
        "--adapter" in gguf.output, gguf.output
