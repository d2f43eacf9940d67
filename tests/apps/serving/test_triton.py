"""The Triton model repository: every config.pbtxt parses as Triton's own ModelConfig
(tritonclient's model_config_pb2, strict text format); the forward model's files load in
onnxruntime from the repository and compute the export's logits (the Triton wheel the tests run
has no onnxruntime backend); ``--env`` names the generate model's Python environment. The
generate model on a real server: test_triton_server.py."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.apps.conftest import invoke
from transformer_kit.apps.serving.triton import write_repository
from transformer_kit.core.errors import InputError


def _config(path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())  # unknown fields raise


@pytest.fixture(scope="module")
def repo(exported, tmp_path_factory):
    _, folder = exported
    repo = tmp_path_factory.mktemp("triton")
    written = write_repository(folder / "onnx", repo, "tiny", max_batch=8)
    assert [p.parent.name for p in written] == ["tiny_forward", "tiny_generate"]
    return repo


def test_the_configs_follow_triton_s_schema(repo, onnx_model):
    forward = _config(repo / "tiny_forward" / "config.pbtxt")
    assert forward.platform == "onnxruntime_onnx" and forward.max_batch_size == 8
    assert [i.name for i in forward.input] == ["input_ids", "attention_mask"]
    assert all(list(i.dims) == [-1] and i.data_type == model_config_pb2.TYPE_INT64 for i in forward.input)
    assert list(forward.output[0].dims) == [-1, onnx_model.manifest.tgt_vocab]
    assert forward.output[0].data_type == model_config_pb2.TYPE_FP32
    assert forward.HasField("dynamic_batching")
    generate = _config(repo / "tiny_generate" / "config.pbtxt")
    assert generate.backend == "python" and generate.model_transaction_policy.decoupled
    assert all(i.optional for i in generate.input)  # one prompt input a request, checked by model.py
    assert [i.name for i in generate.input] == ["input_ids", "max_new_tokens", "temperature", "top_p",
                                                "seed"]  # no tokenizer in this export: no text
    assert [o.name for o in generate.output] == ["token_ids"]
    assert generate.parameters["export_folder"].string_value == "export"
    assert "EXECUTION_ENV_PATH" not in generate.parameters
    with pytest.raises(text_format.ParseError):  # the check is real: a wrong field is refused
        text_format.Parse('name: "x"\nbatch_size: 4\n', model_config_pb2.ModelConfig())


def test_the_forward_model_loads_from_the_repository_and_computes_the_export_s_logits(repo, onnx_model):
    session = ort.InferenceSession(str(repo / "tiny_forward" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    ids = np.array([[5, 6, 7, 8], [9, 10, 11, 12]])
    logits = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    # the same graph and weights; OnnxModel skips one onnxruntime fusion on the CPU, so the last bits
    np.testing.assert_allclose(logits, onnx_model(ids, attention_mask=np.ones_like(ids)), rtol=0, atol=1e-5)


def test_env_names_the_generate_model_s_python_environment(exported, tmp_path):
    _, folder = exported
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    result = invoke("triton", str(folder / "onnx"), "-o", str(tmp_path / "repo"), "--env", str(venv))
    assert result.exit_code == 0, result.output
    generate = _config(tmp_path / "repo" / "onnx_generate" / "config.pbtxt")
    assert generate.parameters["EXECUTION_ENV_PATH"].string_value == str(venv.resolve())
    refused = invoke("triton", str(folder / "onnx"), "-o", str(tmp_path / "repo"), "--env", str(tmp_path))
    assert refused.exit_code == 1 and "bin/activate" in refused.output


def test_bad_names_and_folders_are_refused(exported, tmp_path):
    _, folder = exported
    with pytest.raises(InputError, match="letters, digits"):
        write_repository(folder / "onnx", tmp_path, "tiny model")
    result = invoke("triton", str(folder / "model"), "-o", str(tmp_path / "repo"))
    assert result.exit_code == 1 and "not an export folder" in result.output
    written = invoke("triton", str(folder / "onnx"), "-o", str(tmp_path / "repo"), "--name", "m")
    assert written.exit_code == 0, written.output
    assert (tmp_path / "repo" / "m_forward" / "1" / "weights.data").is_file()


def test_embedding_and_cross_encoder_exports_get_models_of_their_kind(embedding_export,
                                                                        cross_encoder_export, tmp_path):
    _, embedder = embedding_export
    _, reranker = cross_encoder_export
    written = write_repository(embedder.path, tmp_path, "st", max_prompt_tokens=20, max_request_seconds=5)
    assert [p.parent.name for p in written] == ["st_forward", "st_embed"]
    embed = _config(tmp_path / "st_embed" / "config.pbtxt")
    assert embed.backend == "python" and embed.model_transaction_policy.decoupled
    assert [(i.name, list(i.dims), i.optional) for i in embed.input] == [
        ("text_input", [-1], False), ("dimensions", [1], True)]
    assert [(o.name, list(o.dims)) for o in embed.output] == [("embedding", [-1, -1])]
    assert embed.parameters["max_prompt_tokens"].string_value == "20"
    assert embed.parameters["max_request_seconds"].string_value == "5"
    written = write_repository(reranker.path, tmp_path, "ce")
    assert [p.parent.name for p in written] == ["ce_forward", "ce_rerank"]
    rerank = _config(tmp_path / "ce_rerank" / "config.pbtxt")
    assert [i.name for i in rerank.input] == ["query", "documents"]
    assert [(o.name, o.data_type) for o in rerank.output] == [("scores", model_config_pb2.TYPE_FP32)]
    assert "max_prompt_tokens" not in rerank.parameters  # the model's own bound
    with pytest.raises(InputError, match="max_request_seconds"):
        write_repository(reranker.path, tmp_path, "ce", max_request_seconds=0)


def test_the_key_goes_on_triton_s_command_line_never_into_the_repository(exported, tmp_path):
    _, folder = exported
    result = invoke("triton", str(folder / "onnx"), "-o", str(tmp_path / "repo"), "--api-key", "s3cret")
    assert result.exit_code == 0, result.output
    assert "'--http-restricted-api=inference:authorization=Bearer s3cret'" in result.output
    assert "'--grpc-restricted-protocol=inference:authorization=Bearer s3cret'" in result.output
    assert not any("s3cret" in p.read_text() for p in (tmp_path / "repo").rglob("*.pbtxt"))
    refused = invoke("triton", str(folder / "onnx"), "-o", str(tmp_path / "other"), "--api-key", "a,b")
    assert refused.exit_code == 1 and "comma" in refused.output and not (tmp_path / "other").exists()


def test_the_body_bound_goes_into_the_model_s_config_and_on_triton_s_command_line(exported, tmp_path):
    _, folder = exported
    result = invoke("triton", str(folder / "onnx"), "-o", str(tmp_path / "repo"))
    assert result.exit_code == 0, result.output
    generate = _config(tmp_path / "repo" / "onnx_generate" / "config.pbtxt")
    assert generate.parameters["max_body_bytes"].string_value == str(4 * 2**20)  # serve's default
    start = next(line for line in result.output.splitlines() if line.startswith("start Triton with"))
    assert "--http-max-input-size" not in start  # the wheel's Triton 24.10 would not start
    said = " ".join(result.output.split())  # the console wraps long lines
    assert "on Triton 25.06 or later also add --http-max-input-size=4194304" in said
    result = invoke("triton", str(folder / "onnx"), "-o", str(tmp_path / "repo"), "--max-body-mb", "0.5",
                    "--api-key", "k")
    assert result.exit_code == 0, result.output
    assert "--http-max-input-size=524288" in result.output and "--http-restricted-api=" in result.output
    generate = _config(tmp_path / "repo" / "onnx_generate" / "config.pbtxt")
    assert generate.parameters["max_body_bytes"].string_value == "524288"
    refused = invoke("triton", str(folder / "onnx"), "-o", str(tmp_path / "other"), "--max-body-mb", "0")
    assert refused.exit_code == 1 and "at least 1 byte" in refused.output
    assert not (tmp_path / "other").exists()
    written = write_repository(folder / "onnx", tmp_path / "plain", "tiny")
    assert "max_body_bytes" not in _config(written[-1]).parameters  # the library's default: no bound
