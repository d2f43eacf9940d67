"""How much memory an export will need at its peak, estimated before it starts.

The weights are written one at a time, so the peak follows the largest tensor, not the model:
it is read (in the checkpoint's dtype), turned to float32 and transposed or quantized in a copy,
about three float32 copies of it at once, beside a fixed working allowance (the graphs' building,
int4's calibration batch and block search). Verification adds the onnxruntime session over the export (its
``weights.data`` is mapped, and read pages count) and PyTorch's reference, one large layer at a
time in float64 when the float32 spread is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from transformer_kit.core.errors import ExportError
from transformer_kit.core.memory import available_memory

#: The working allowance beside the largest tensor's copies, with room to spare: the graphs'
#: building and passes, int4's calibration batch (its windows at once) and its block search (a
#: chunk per core).
WORKING_BYTES = 600_000_000
#: Quantized folder bytes per float32 weight byte, rounded up to cover a model whose embedding
#: is a large share of its weights: the default Int4 keeps 4-bit blocks of 32 (4 bits and a scale:
#: symmetric, no zero point) with the embedding and the first eighth of the layers in 8-bit blocks;
#: int8 is 0.25.
INT4_FOLDER_RATIO = 0.25


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimated peak bytes of an export, with and without verification."""

    writing: int
    verifying: int

    def peak(self, verify: bool) -> int:
        return max(self.writing, self.verifying) if verify else self.writing


def estimate(model: nn.Module, quantize: object, dtype: str) -> MemoryEstimate:
    """The peak memory of exporting ``model`` (parameters on any device, ``meta`` included)."""
    params = list(model.parameters())
    largest = max((p.numel() for p in params), default=0)
    weights32 = sum(p.numel() for p in params) * 4
    writing = WORKING_BYTES + 3 * largest * 4
    folder = weights32 * (INT4_FOLDER_RATIO if quantize else (0.5 if dtype == "float16" else 1.0))
    verifying = WORKING_BYTES + int(folder) + largest * 8 * 2
    return MemoryEstimate(writing, verifying)


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def refuse_if_too_large(model: nn.Module, quantize: object, dtype: str, verify: bool) -> None:
    """Raise :class:`ExportError`, before anything is written, when the export's estimated peak
    is more than the memory available now; the message says what would fit."""
    available = available_memory()
    if available is None:
        return
    needs = estimate(model, quantize, dtype)
    if needs.peak(verify) <= available:
        return
    options = []
    if verify and needs.writing <= available:
        options.append(f"verify=False (--no-verify) needs about {_gb(needs.writing)}")
    if not quantize:
        int4 = estimate(model, "int4", "float32")
        if int4.peak(verify) <= available:
            options.append(f"quantize='int4' needs about {_gb(int4.peak(verify))}")
    hint = f"What would fit: {'; '.join(options)}" if options else "Free memory, or use a machine with more"
    raise ExportError(
        f"This export needs about {_gb(needs.peak(verify))} of memory at its peak (the largest "
        f"tensor, {_gb(max((p.numel() for p in model.parameters()), default=0) * 4)} in float32, "
        f"written in copies{', and verification' if verify else ''}), more than the "
        f"{_gb(available)} available now. {hint}.")
