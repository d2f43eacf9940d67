"""The manifest of an exported model: what each graph is, its inputs/outputs, the config, versions;
and the checks that an export folder's files are what it says, inside the folder.

Written by the export, read by :class:`~transformer_kit.runtime.OnnxModel`; needs neither torch
nor the plugins.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnx.external_data_helper import uses_external_data

from transformer_kit.core.config_files import read_json_object
from transformer_kit.core.errors import ArtifactError, missing_path

MANIFEST_FILE = "manifest.json"
FORMAT = "transformer_kit.onnx"
FORMAT_VERSION = 1


@dataclass
class GraphInfo:
    """One ONNX graph of the artifact."""

    file: str
    inputs: list[str]
    outputs: list[str]


@dataclass
class Manifest:
    """Everything :class:`OnnxModel` needs to run the graphs.

    graphs: ``model`` (the full forward) always; ``decoder_step`` for generating
    architectures; ``encoder`` for encoder_decoder (memory and cross-attention keys/values,
    computed once per input).
    """

    architecture: str
    config: dict[str, Any]
    dtype: str
    opset: int
    graphs: dict[str, GraphInfo]
    num_decoder_layers: int
    kv_heads: int
    head_dim: int
    src_vocab: int
    tgt_vocab: int
    pad_id: int | None
    bos_id: int | None
    eos_id: int | list[int] | None
    max_positions: int | None
    quantization: str | None = None
    #: int4: block_size, accuracy_level, symmetric, head (see ``transformer_kit.export.Int4``).
    quantization_options: dict[str, Any] = field(default_factory=dict)
    optimized_for: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    #: The tokenizer files in the folder (tokenizer.json first), empty without a tokenizer.
    tokenizer: list[str] = field(default_factory=list)
    verification: dict[str, Any] = field(default_factory=dict)
    #: The checkpoint's sampling defaults (``transformer_kit.core.decoding.defaults``), {} for none.
    generation_defaults: dict[str, Any] = field(default_factory=dict)

    def write(self, folder: Path) -> None:
        data = {"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(self)}
        (folder / MANIFEST_FILE).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, folder: str | Path) -> Manifest:
        """Read and check ``manifest.json`` in ``folder``; raises :class:`ArtifactError`."""
        folder = Path(folder)
        path = folder / MANIFEST_FILE
        if not folder.exists():
            raise ArtifactError(missing_path(folder, "an export folder written by export_onnx"))
        if not path.is_file():
            raise ArtifactError(
                f"{str(folder)!r} is not an exported transformer_kit model: {MANIFEST_FILE} is "
                "missing. Create one with transformer_kit.export.export_onnx(model, folder)."
            )
        data = read_json_object(path, ArtifactError, "Export the model again.")
        if data.get("format") != FORMAT:
            raise ArtifactError(f"{str(path)!r} was not written by transformer_kit's export_onnx.")
        if data.get("format_version") != FORMAT_VERSION:
            raise ArtifactError(
                f"{str(path)!r} has format version {data.get('format_version')!r}; this "
                f"transformer_kit reads version {FORMAT_VERSION}. Export the model again."
            )
        data = {k: v for k, v in data.items() if k not in ("format", "format_version")}
        try:
            data["graphs"] = {name: GraphInfo(**g) for name, g in data["graphs"].items()}
            manifest = cls(**data)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ArtifactError(f"{str(path)!r} is incomplete or malformed ({exc}); export again.") from None
        named = [(f"graph {name!r}", g.file) for name, g in manifest.graphs.items()]
        for what, file in named + [("tokenizer file", f) for f in manifest.tokenizer]:
            if not isinstance(file, str) or not inside(folder, file):
                raise ArtifactError(
                    f"{str(path)!r} names {what} at {file!r}, outside the export folder; refusing "
                    "to read it. Export the model again.")
        for name, graph in manifest.graphs.items():
            if not (folder / graph.file).is_file():
                raise ArtifactError(
                    f"Graph {name!r} of {str(folder)!r} is missing: {graph.file} does not exist."
                )
        return manifest


def inside(folder: Path, relative: str) -> bool:
    """Whether ``relative`` names a path within ``folder`` (no absolute path, no ``..`` out,
    no link leading elsewhere)."""
    if not relative or Path(relative).is_absolute():
        return False
    root = folder.resolve()
    return (root / relative).resolve().is_relative_to(root)


def check_graph(folder: Path, file: str, inputs: list[str], outputs: list[str]) -> None:
    """Read graph ``file`` of ``folder`` (without its weights) and refuse it, with an
    :class:`ArtifactError`, when it is unreadable, its inputs or outputs are not ``inputs``
    and ``outputs``, or any of its external data lies outside ``folder``."""
    try:
        proto = onnx.load(str(folder / file), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and others
        raise ArtifactError(f"onnxruntime cannot load {str(folder / file)!r}: it is not a readable "
                            f"ONNX graph ({type(exc).__name__}). The file may be truncated or corrupt; "
                            "export the model again.") from None
    graph = proto.graph
    initializers = {t.name for t in graph.initializer}
    found_inputs = [i.name for i in graph.input if i.name not in initializers]
    found_outputs = [o.name for o in graph.output]
    if found_inputs != inputs or found_outputs != outputs:
        raise ArtifactError(
            f"{file} does not match the manifest: the graph has inputs {found_inputs} and "
            f"outputs {found_outputs}, the manifest lists {inputs} and {outputs}. "
            "Export the model again.")
    tensors = list(graph.initializer) + [
        a.t for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
    for tensor in tensors:
        if not uses_external_data(tensor):
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        if not inside(folder, location):
            raise ArtifactError(
                f"{file} in {str(folder)!r} reads tensor {tensor.name!r} from {location!r}, outside "
                "the export folder; refusing to load it. Export the model again.")
