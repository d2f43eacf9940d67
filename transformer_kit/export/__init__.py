"""ONNX export: graphs written by each component's lowering, weights streamed to one file,
every export verified by running it through the runtime.

    from transformer_kit.export import export_onnx
    from transformer_kit.runtime import OnnxModel
    report = export_onnx(model, "out/")          # graphs + manifest, verified against PyTorch
    om = OnnxModel("out/")                        # numpy + onnxruntime only
    om.generate(ids, max_new_tokens=16)
    export_onnx(model, "out-int4/", quantize="int4")   # 4-bit MatMulNBits weights

``export_onnx`` needs torch; running an export does not (:mod:`transformer_kit.runtime`, whose
``OnnxModel`` and ``Manifest`` this package also names, as the export writes what they read).
"""

from __future__ import annotations

from typing import Any

from transformer_kit.core.dependencies import needing_torch

__all__ = ["ExportReport", "Int4", "Manifest", "OnnxModel", "export_onnx"]


#: Each name and the module it lives in, imported when first read.
_NAMES = {"export_onnx": "transformer_kit.export.exporter", "ExportReport": "transformer_kit.export.report",
          "Int4": "transformer_kit.export.quantize", "OnnxModel": "transformer_kit.runtime.onnx_model",
          "Manifest": "transformer_kit.runtime.manifest"}


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'transformer_kit.export' has no attribute {name!r}")
    return needing_torch(_NAMES[name], name)
