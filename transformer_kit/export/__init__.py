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

__all__ = ["ExportReport", "Int4", "Manifest", "OnnxModel", "export_onnx"]


def __getattr__(name: str) -> Any:
    if name == "export_onnx":
        from transformer_kit.export.exporter import export_onnx

        return export_onnx
    if name == "ExportReport":
        from transformer_kit.export.report import ExportReport

        return ExportReport
    if name == "Int4":
        from transformer_kit.export.quantize import Int4

        return Int4
    if name == "OnnxModel":
        from transformer_kit.runtime.onnx_model import OnnxModel

        return OnnxModel
    if name == "Manifest":
        from transformer_kit.runtime.manifest import Manifest

        return Manifest
    raise AttributeError(f"module 'transformer_kit.export' has no attribute {name!r}")
