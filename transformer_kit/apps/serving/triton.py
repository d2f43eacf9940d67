"""A Triton Inference Server model repository from an export folder.

Two models, each a folder with ``config.pbtxt`` and a version ``1``:

- ``{name}_forward``: the forward graph (``model.onnx`` with its ``weights.data``) on Triton's
  onnxruntime backend, batch axis dynamic (``max_batch_size``), other axes ``-1``, dynamic
  batching on (Triton batches requests of equal shapes);
- ``{name}_generate``: generation on the Python backend in decoupled mode (a response per
  token, then a final flag), transformer-kit's continuous-batching engine over a copy of the
  export folder (up to ``max_batch`` requests decoded together): token ids in and out, text
  in and out where the export has a tokenizer, chat messages where it has a chat template
  (:mod:`.triton_model`). Its Python needs
  transformer-kit installed: the server's own, or the environment ``env`` names (Triton's
  ``EXECUTION_ENV_PATH``: a virtual environment's folder or a conda-pack archive).

The configs follow Triton's ``ModelConfig`` protobuf schema (tests parse them with
``tritonclient``'s ``model_config_pb2``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from transformer_kit.decoding.text import TextTokenizer
from transformer_kit.errors import InputError
from transformer_kit.export.manifest import Manifest

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


def _generate_config(name: str, export: Path, env: Path | None, max_batch: int) -> str:
    """The generate model's config: ``input_ids`` always, ``text_input`` (and the output
    ``text_output``) with a tokenizer, ``messages`` with a chat template; exactly one per request.
    Its engine decodes up to ``max_batch`` requests together, ``4 * max_batch`` more waiting."""
    tokenizer = TextTokenizer.from_folder(export)
    prompts = [_tensor("input_ids", "TYPE_INT64", [-1], optional=True)]
    outputs = [_tensor("token_ids", "TYPE_INT64", [-1])]
    if tokenizer is not None:
        prompts.append(_tensor("text_input", "TYPE_STRING", [1], optional=True))
        outputs.append(_tensor("text_output", "TYPE_STRING", [1]))
        if tokenizer.chat_templates:
            prompts.append(_tensor("messages", "TYPE_STRING", [1], optional=True))
    inputs = ",\n".join(prompts + [_tensor(n, t, [1], optional=True)
                                   for n, t in GENERATE_OPTIONS.items()])
    output = ",\n".join(outputs)
    environment = "" if env is None else _parameter("EXECUTION_ENV_PATH", str(env))
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            "model_transaction_policy { decoupled: true }\n"
            f"input [\n{inputs}\n]\noutput [\n{output}\n]\n"
            'instance_group [ { kind: KIND_CPU count: 1 } ]\n'
            + _parameter("export_folder", "export") + _parameter("max_batch", str(max_batch))
            + _parameter("max_queue", str(4 * max_batch)) + environment)


def _copy(source: Path, target: Path) -> None:
    """A hard link where the file system allows (no second copy of the weights), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def write_repository(export: str | Path, repo: str | Path, name: str, max_batch: int = 16,
                     env: str | Path | None = None) -> list[Path]:
    """Write the two models of ``export`` (an export folder) into the Triton repository ``repo``
    (created if missing; models of other names in it are left alone). ``env``: the Python
    environment the generate model runs in (a folder or a ``.tar.gz``; absent: the server's
    own Python). Returns the ``config.pbtxt`` paths written."""
    export, repo = Path(export), Path(repo)
    if env is not None:
        env = Path(env).resolve()
        if not (env / "bin" / "activate").is_file() and not env.name.endswith(".tar.gz"):
            raise InputError(f"{str(env)!r} is not a Python environment Triton can activate (a "
                             "folder with bin/activate, e.g. a virtual environment, or a "
                             "conda-pack .tar.gz); make one with python -m venv and install "
                             "transformer-kit into it.")
    manifest = Manifest.read(export)
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise InputError(f"Model name {name!r} must be letters, digits, '-' and '_' only (it names "
                         "folders of the repository and Triton's models).")
    if max_batch < 1:
        raise InputError(f"max_batch must be at least 1, got {max_batch}.")
    written = []
    forward, generate = repo / f"{name}_forward", repo / f"{name}_generate"
    for model in (forward, generate):
        if model.exists():
            shutil.rmtree(model)
        (model / "1").mkdir(parents=True)
    graph = manifest.graphs["model"]
    _copy(export / graph.file, forward / "1" / "model.onnx")
    for data in export.glob("*.data"):  # the external weights, next to the graph as it expects
        _copy(data, forward / "1" / data.name)
    (forward / "config.pbtxt").write_text(_forward_config(forward.name, manifest, max_batch))
    written.append(forward / "config.pbtxt")
    if "decoder_step" in manifest.graphs:
        (generate / "1" / "export").mkdir()
        for item in export.iterdir():
            if item.is_file():
                _copy(item, generate / "1" / "export" / item.name)
        shutil.copy2(Path(__file__).with_name("triton_model.py"), generate / "1" / "model.py")
        (generate / "config.pbtxt").write_text(_generate_config(generate.name, export, env, max_batch))
        written.append(generate / "config.pbtxt")
    else:
        shutil.rmtree(generate)
    return written
