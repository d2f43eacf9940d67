"""The Triton model repository: every config.pbtxt parses as Triton's own ModelConfig
(tritonclient's model_config_pb2, strict text format); the forward model's files load in
onnxruntime from the repository and compute the export's logits; the decoupled Python model,
run against a stand-in for the backend's utility module, streams generate's tokens."""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.apps.conftest import invoke
from transformer_kit.apps.serving.triton import write_repository
from transformer_kit.errors import InputError


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
    assert [i.name for i in generate.input if not i.optional] == ["input_ids"]
    assert generate.parameters["export_folder"].string_value == "export"
    with pytest.raises(text_format.ParseError):  # the check is real: a wrong field is refused
        text_format.Parse('name: "x"\nbatch_size: 4\n', model_config_pb2.ModelConfig())


def test_the_forward_model_loads_from_the_repository_and_computes_the_export_s_logits(repo, onnx_model):
    session = ort.InferenceSession(str(repo / "tiny_forward" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    ids = np.array([[5, 6, 7, 8], [9, 10, 11, 12]])
    logits = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    # the same graph and weights; OnnxModel skips one onnxruntime fusion on the CPU, so the last bits
    np.testing.assert_allclose(logits, onnx_model(ids, attention_mask=np.ones_like(ids)), rtol=0, atol=1e-5)


class _Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class _Response:
    def __init__(self, output_tensors=(), error=None) -> None:
        self.output_tensors, self.error = list(output_tensors), error


class _Sender:
    def __init__(self) -> None:
        self.sent: list[tuple[_Response | None, int]] = []

    def send(self, response=None, flags: int = 0) -> None:
        self.sent.append((response, flags))


class _Request:
    def __init__(self, **inputs: np.ndarray) -> None:
        self.inputs, self.sender = inputs, _Sender()

    def get_response_sender(self) -> _Sender:
        return self.sender


def _backend_utils() -> types.ModuleType:
    """The names model.py uses of Triton's ``triton_python_backend_utils``, as the backend
    documents them (tensors by name, responses with tensors or an error, the final flag)."""
    utils = types.ModuleType("triton_python_backend_utils")
    utils.Tensor, utils.InferenceResponse, utils.TritonError = _Tensor, _Response, RuntimeError
    utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    utils.get_input_tensor_by_name = lambda request, name: (
        _Tensor(name, request.inputs[name]) if name in request.inputs else None)
    return utils


def test_the_decoupled_python_model_streams_generate_s_tokens(repo, onnx_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _backend_utils())
    version = repo / "tiny_generate" / "1"
    spec = importlib.util.spec_from_file_location("tiny_generate_model", version / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    config = json.dumps({"parameters": {"export_folder": {"string_value": "export"}}})
    model.initialize({"model_config": config, "model_repository": str(repo / "tiny_generate"),
                      "model_version": "1"})
    prompt = np.array([5, 6, 7], np.int64)
    greedy = _Request(input_ids=prompt, max_new_tokens=np.array([9]))
    sampled = _Request(input_ids=prompt, max_new_tokens=np.array([9]),
                       temperature=np.array([0.8], np.float32), seed=np.array([3]))
    broken = _Request(input_ids=np.array([5, 99]), max_new_tokens=np.array([3]))
    model.execute([greedy, sampled, broken])
    for request, options in ((greedy, {}), (sampled, {"do_sample": True, "temperature": 0.8, "seed": 3})):
        tokens = [int(r.output_tensors[0].array[0]) for r, _ in request.sender.sent[:-1]]
        expected = onnx_model.generate(prompt[None], max_new_tokens=9, **options)[0].tolist()
        assert tokens == expected[:len(tokens)] and len(tokens) >= 1
        assert request.sender.sent[-1] == (None, 1)  # the final flag, once
    (response, flags), = broken.sender.sent
    assert flags == 1 and "99" in str(response.error)


def test_bad_names_and_folders_are_refused(exported, tmp_path):
    _, folder = exported
    with pytest.raises(InputError, match="letters, digits"):
        write_repository(folder / "onnx", tmp_path, "tiny model")
    result = invoke("triton", str(folder / "model"), "-o", str(tmp_path / "repo"))
    assert result.exit_code == 1 and "not an export folder" in result.output
    written = invoke("triton", str(folder / "onnx"), "-o", str(tmp_path / "repo"), "--name", "m")
    assert written.exit_code == 0, written.output
    assert (tmp_path / "repo" / "m_forward" / "1" / "weights.data").is_file()
