"""A Triton Inference Server model repository from an export folder.

Two models, each a folder with ``config.pbtxt`` and a version ``1``:

- ``{name}_forward``: the forward graph (``model.onnx`` with its ``weights.data``) on Triton's
  onnxruntime backend, batch axis dynamic (``max_batch_size``), other axes ``-1``, dynamic
  batching on (Triton batches requests of equal shapes);
- the model of what the export serves, on the Python backend in decoupled mode over a copy of
  the export folder, with transformer-kit's engine batching every client's requests and the
  server's limits (prompt tokens, request time) applied by the runtime and the request size by
  the model (:mod:`.triton_model`):
  ``{name}_generate`` for a decoder (a response per token, then a final flag; token ids in
  and out, text in and out where the export has a tokenizer, chat messages where it has a chat
  template, up to ``max_batch`` requests decoded together), ``{name}_embed`` for a
  sentence-embedding model (texts in, one response with their vectors) and ``{name}_rerank``
  for a cross-encoder (a query and documents in, one response with their scores).
  Its Python needs transformer-kit installed: the server's own, or the environment ``env``
  names (Triton's ``EXECUTION_ENV_PATH``: a virtual environment's folder or a conda-pack
  archive).

The configs follow Triton's ``ModelConfig`` protobuf schema (tests parse them with
``tritonclient``'s ``model_config_pb2``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from transformer_kit.core.errors import InputError
from transformer_kit.runtime import Limits, OnnxModel, model_kind, prompt_forms
from transformer_kit.runtime.manifest import Manifest

_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16"}
#: Options the generate model takes besides ``input_ids``, each optional: name -> Triton type.
GENERATE_OPTIONS = {"max_new_tokens": "TYPE_INT64", "temperature": "TYPE_FP32",
                    "top_p": "TYPE_FP32", "seed": "TYPE_INT64"}


def _tensor(name: str, kind: str, dims: list[int], optional: bool = False) -> str:
    extra = " optional: true" if optional else ""
    return f'  {{ name: "{name}" data_type: {kind} dims: [ {", ".join(map(str, dims))} ]{extra} }}'


def _forward_config(name: str, manifest: Manifest, max_batch: int) -> str:
    graph = manifest.graphs["model"]
    width = manifest.tgt_vocab if graph.outputs[0] == "logits" else manifest.config["d_model"]
    inputs = ",\n".join(_tensor(n, "TYPE_INT64", [-1]) for n in graph.inputs)
    output = _tensor(graph.outputs[0], _TYPES[manifest.dtype], [-1, width])
    return (f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'
            f"input [\n{inputs}\n]\noutput [\n{output}\n]\n"
            "dynamic_batching { max_queue_delay_microseconds: 1000 }\n")


def _parameter(key: str, value: str) -> str:
    return f"parameters {{ key: {json.dumps(key)} value: {{ string_value: {json.dumps(value)} }} }}\n"


def _prompts(model: OnnxModel) -> tuple[list[str], list[str]]:
    """The generate model's prompt inputs and outputs: ``input_ids`` always, ``text_input`` (and
    the output ``text_output``) with a tokenizer, ``messages`` with a chat template."""
    takes = prompt_forms(model)
    prompts = [_tensor("input_ids", "TYPE_INT64", [-1], optional=True)]
    outputs = [_tensor("token_ids", "TYPE_INT64", [-1])]
    if "text" in takes:
        prompts.append(_tensor("text_input", "TYPE_STRING", [1], optional=True))
        outputs.append(_tensor("text_output", "TYPE_STRING", [1]))
    if "messages" in takes:
        prompts.append(_tensor("messages", "TYPE_STRING", [1], optional=True))
    return prompts + [_tensor(n, t, [1], optional=True) for n, t in GENERATE_OPTIONS.items()], outputs


#: Each kind's model: its name's suffix, inputs and outputs (the generate model's: _prompts).
_POOLING = {
    "embeddings": ("embed", [_tensor("text_input", "TYPE_STRING", [-1]),
                             _tensor("dimensions", "TYPE_INT64", [1], optional=True)],
                   [_tensor("embedding", "TYPE_FP32", [-1, -1])]),
    "rerank": ("rerank", [_tensor("query", "TYPE_STRING", [1]),
                          _tensor("documents", "TYPE_STRING", [-1])],
               [_tensor("scores", "TYPE_FP32", [-1])]),
}


def _served_config(name: str, inputs: list[str], outputs: list[str], env: Path | None,
                   parameters: dict[str, str]) -> str:
    """A Python-backend model's config, decoupled, with its ``parameters`` (the export's folder,
    the engine's bounds and the limits) and the Python environment ``env``."""
    if env is not None:
        parameters = {**parameters, "EXECUTION_ENV_PATH": str(env)}
    tensors = ",\n".join(inputs), ",\n".join(outputs)
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            "model_transaction_policy { decoupled: true }\n"
            f"input [\n{tensors[0]}\n]\noutput [\n{tensors[1]}\n]\n"
            'instance_group [ { kind: KIND_CPU count: 1 } ]\n'
            + "".join(_parameter(k, v) for k, v in parameters.items()))


def key_flags(api_key: str) -> list[str]:
    """``tritonserver``'s flags that make inference need ``Authorization: Bearer API_KEY`` on
    HTTP and gRPC, as ``transformer-kit serve --api-key`` does (health and metadata stay open).
    The key goes on Triton's command line, never into the repository."""
    if not api_key.strip() or any(c in api_key for c in ",= \n"):
        raise InputError("The API key is empty or holds a comma, '=', a space or a newline, which "
                         "tritonserver's --http-restricted-api cannot carry; give a key of letters, "
                         "digits and punctuation.")
    header = f"authorization=Bearer {api_key}"
    return [f"--http-restricted-api=inference:{header}", f"--grpc-restricted-protocol=inference:{header}"]


#: The first Triton release with ``--http-max-input-size`` (2.59.0, container 25.06): earlier
#: ones, the nvidia-pytriton wheel's 2.51 (24.10) among them, refuse the flag and do not start.
HTTP_MAX_INPUT_SIZE_SINCE = "25.06"


def body_flags(max_body_bytes: int) -> list[str]:
    """``tritonserver``'s flags that bound a request's size to ``max_body_bytes``, as
    ``transformer-kit serve --max-body-mb`` bounds a body: ``--http-max-input-size``, with which
    Triton refuses (400) an HTTP request whose JSON, or one of whose inputs, is larger, before
    parsing it (Triton 25.06 and later; earlier releases refuse the flag). Triton has no flag
    for gRPC: its server takes messages up to 2 GiB in every release; there, and on Triton before
    25.06, the served model's own bound (the config's ``max_body_bytes``) refuses larger inputs,
    once Triton has read them."""
    return [f"--http-max-input-size={_body_bound(max_body_bytes)}"]


def _body_bound(max_body_bytes: int) -> int:
    """``max_body_bytes``, refused below 1 byte."""
    if max_body_bytes < 1:
        raise InputError(f"The bound on a request's body must be at least 1 byte, got {max_body_bytes} "
                         "(--max-body-mb: more than 0).")
    return max_body_bytes


def _copy(source: Path, target: Path) -> None:
    """A hard link where the file system allows (no second copy of the weights), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def write_repository(export: str | Path, repo: str | Path, name: str, max_batch: int = 16,
                     env: str | Path | None = None, *, max_prompt_tokens: int | None = None,
                     max_request_seconds: float | None = None,
                     max_body_bytes: int | None = None) -> list[Path]:
    """Write the two models of ``export`` (an export folder) into the Triton repository ``repo``
    (created if missing; models of other names in it are left alone): ``{name}_forward`` and
    the model of what the export serves (``{name}_generate``, ``{name}_embed`` or
    ``{name}_rerank``). ``env``: the Python environment the served model runs in (a folder or
    a ``.tar.gz``; absent: the server's own Python). ``max_prompt_tokens`` (None: the model's
    context length) and ``max_request_seconds`` (None: no bound) bound its requests as
    ``transformer-kit serve``'s; ``max_body_bytes`` (None: no bound) the bytes of a request's
    inputs, as ``serve``'s body bound (Triton's own HTTP bound: :func:`body_flags`). Returns the
    ``config.pbtxt`` paths written."""
    export, repo = Path(export), Path(repo)
    env = _environment(env)
    manifest = Manifest.read(export)
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise InputError(f"Model name {name!r} must be letters, digits, '-' and '_' only (it names "
                         "folders of the repository and Triton's models).")
    if max_batch < 1:
        raise InputError(f"max_batch must be at least 1, got {max_batch}.")
    bounds = _bounds(max_prompt_tokens, max_request_seconds, max_body_bytes)
    model = OnnxModel(export, providers="cpu")
    kind = model_kind(model)
    if kind == "transcribe":
        raise InputError("A Triton repository holds decoders, sentence-embedding models and "
                         "cross-encoders; a speech model is served on /v1/audio/transcriptions by "
                         "transformer-kit serve (or serve --ray).")
    forward = _model_folder(repo / f"{name}_forward")
    _copy(export / manifest.graphs["model"].file, forward / "1" / "model.onnx")
    for data in export.glob("*.data"):  # the external weights, next to the graph as it expects
        _copy(data, forward / "1" / data.name)
    (forward / "config.pbtxt").write_text(_forward_config(forward.name, manifest, max_batch))
    if kind == "generate" and "decoder_step" not in manifest.graphs:
        return [forward / "config.pbtxt"]  # an encoder-decoder: its forward graph only
    suffix, inputs, outputs = ("generate", *_prompts(model)) if kind == "generate" else _POOLING[kind]
    served = _model_folder(repo / f"{name}_{suffix}")
    (served / "1" / "export").mkdir()
    for item in export.iterdir():
        if item.is_file():
            _copy(item, served / "1" / "export" / item.name)
    shutil.copy2(Path(__file__).with_name("triton_model.py"), served / "1" / "model.py")
    parameters = {"export_folder": "export", "max_batch": str(max_batch), "max_queue": str(4 * max_batch),
                  **bounds}
    (served / "config.pbtxt").write_text(_served_config(served.name, inputs, outputs, env, parameters))
    return [forward / "config.pbtxt", served / "config.pbtxt"]


def _bounds(max_prompt_tokens: int | None, max_request_seconds: float | None,
            max_body_bytes: int | None) -> dict[str, str]:
    """The served model's parameters for the bounds given (None: not given), each checked."""
    limits = Limits.of(None, max_prompt_tokens, max_request_seconds)  # refuses a bound below 1
    bounds = {}
    if max_prompt_tokens is not None:
        bounds["max_prompt_tokens"] = str(limits.max_prompt_tokens)
    if max_request_seconds is not None:
        bounds["max_request_seconds"] = f"{max_request_seconds:g}"
    if max_body_bytes is not None:
        bounds["max_body_bytes"] = str(_body_bound(max_body_bytes))
    return bounds


def _environment(env: str | Path | None) -> Path | None:
    """``env`` as an absolute path, checked to be an environment Triton can activate."""
    if env is None:
        return None
    env = Path(env).resolve()
    if not (env / "bin" / "activate").is_file() and not env.name.endswith(".tar.gz"):
        raise InputError(f"{str(env)!r} is not a Python environment Triton can activate (a "
                         "folder with bin/activate, e.g. a virtual environment, or a "
                         "conda-pack .tar.gz); make one with python -m venv and install "
                         "transformer-kit into it.")
    return env


def _model_folder(model: Path) -> Path:
    """A model's folder with its version ``1``, emptied first."""
    if model.exists():
        shutil.rmtree(model)
    (model / "1").mkdir(parents=True)
    return model
