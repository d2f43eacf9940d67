"""The manifest of an exported model: what each graph is, its inputs/outputs, the config, versions.

Read by :class:`transformer_kit.export.OnnxModel`; needs neither torch nor the plugins.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from transformer_kit.core.config_files import read_json_object
from transformer_kit.core.errors import ArtifactError, missing_path
from transformer_kit.export.weights import inside

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
