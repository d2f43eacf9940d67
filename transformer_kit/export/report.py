"""What an export reports: the graphs written, their sizes, the measured errors against
PyTorch, the times, and the versions of the packages that made it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any


@dataclass
class ExportReport:
    """What an export produced and how well it matches PyTorch."""

    path: Path
    architecture: str
    opset: int
    dtype: str
    quantization: str | None
    #: Bytes of each graph file and of ``weights.data``, the tensors they share.
    graph_bytes: dict[str, int]
    errors: dict[str, float] = field(default_factory=dict)
    tolerance: float | None = None
    #: PyTorch's own float32 error against float64 on the verification's inputs, which the
    #: default float32 tolerance allows for (None when not measured).
    float32_spread: float | None = None
    #: What the export was verified against (PyTorch float32 in memory, or layer by layer).
    reference: str | None = None
    tokens_match: bool | None = None
    export_seconds: float = 0.0
    verify_seconds: float = 0.0
    optimization: dict[str, Any] | None = None
    #: Bytes of the model's distinct parameters and buffers in the exported dtype.
    weight_bytes: int = 0
    #: Quantized exports: share of positions whose top-1 token equals PyTorch's float32 one
    #: (the verification's random prompts, every real position).
    top1_agreement: float | None = None
    #: Components the export traced alone for lack of a lowering: label -> why, how many times
    #: and how long (empty when every component brought its lowering).
    traced_components: dict[str, str] = field(default_factory=dict)
    #: int4 exports of a model with GGUF blocks (``model.gguf_blocks``): for each quantized
    #: matrix, "GGUF Q4_1 blocks" when the file's own blocks were written (not quantized
    #: again), else "quantized here (why)". Empty for other models.
    weight_origins: dict[str, str] = field(default_factory=dict)

    @property
    def from_file_blocks(self) -> list[str]:
        """The matrices written from the GGUF file's own blocks."""
        return [name for name, origin in self.weight_origins.items() if origin.startswith("GGUF ")]

    @property
    def folder_bytes(self) -> int:
        """Bytes of everything the graphs need: graph files and shared weights."""
        return sum(self.graph_bytes.values())

    @property
    def max_error(self) -> float | None:
        return max(self.errors.values()) if self.errors else None

    def __str__(self) -> str:
        lines = [f"exported {self.architecture} to {self.path} (opset {self.opset}, {self.dtype}"
                 + (f", {self.quantization}" if self.quantization else "") + ")"]
        lines += self._size_lines() + self._verification_lines() + self._component_lines()
        if self.optimization:
            lines.append(f"  optimization: {self.optimization}")
        lines.append(f"  export {self.export_seconds:.1f} s, verify {self.verify_seconds:.1f} s")
        return "\n".join(lines)

    def _size_lines(self) -> list[str]:
        """Each file's size, and the total against the model's weights."""
        lines = [f"  {name:14s} {size / 1e6:9.2f} MB" for name, size in self.graph_bytes.items()]
        if self.weight_bytes:
            lines.append(f"  {'total':14s} {self.folder_bytes / 1e6:9.2f} MB "
                         f"({self.folder_bytes / self.weight_bytes:.2f}x the model's "
                         f"{self.weight_bytes / 1e6:.2f} MB of weights)")
        return lines

    def _verification_lines(self) -> list[str]:
        """What the export was verified against, its errors, tolerance and agreement."""
        lines = []
        if self.reference is not None:
            lines.append(f"  verified against {self.reference}")
        lines += [f"  error {name:20s} {error:.3g}" for name, error in self.errors.items()]
        if self.tolerance is not None:
            spread = (f" (PyTorch's own float32 spread {self.float32_spread:.3g})"
                      if self.float32_spread is not None else "")
            lines.append(f"  tolerance {self.tolerance:.3g}{spread}: passed")
        if self.top1_agreement is not None:
            lines.append(f"  next-token top-1 agreement with PyTorch float32: {self.top1_agreement:.1%}")
        if self.tokens_match is not None:
            lines.append(f"  generated tokens equal PyTorch's: {self.tokens_match}")
        return lines

    def _component_lines(self) -> list[str]:
        """Where the int4 matrices came from, and the components traced for lack of a lowering."""
        lines = []
        if self.weight_origins:
            kept = len(self.from_file_blocks)
            lines.append(f"  int4 matrices: {kept} written from the GGUF file's blocks, "
                         f"{len(self.weight_origins) - kept} quantized here")
            lines += [f"    {name}: {origin}" for name, origin in self.weight_origins.items()
                      if not origin.startswith("GGUF ")]
        if self.traced_components:
            lines.append("  traced alone (no lowering):")
            lines += [f"    {label}: {why}" for label, why in self.traced_components.items()]
        return lines


def versions() -> dict[str, str]:
    """Versions of the packages an export depends on, for the manifest."""
    names = ["transformer-kit", "torch", "onnx", "onnxscript", "onnxruntime", "onnxruntime-gpu"]
    found = {}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    return found
