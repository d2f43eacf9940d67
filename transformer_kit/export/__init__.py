"""ONNX export and the onnxruntime runtime.

    from transformer_kit.export import export_onnx, OnnxModel
    report = export_onnx(model, "out/")          # graphs + manifest, verified against PyTorch
    om = OnnxModel("out/")                        # numpy + onnxruntime only
    om.generate(ids, max_new_tokens=16)
    export_onnx(model, "out-int4/", quantize="int4")   # 4-bit MatMulNBits weights

``OnnxModel`` is imported without torch; ``export_onnx`` needs torch.
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
        from transformer_kit.export.runtime import OnnxModel

        return OnnxModel
    if name == "Manifest":
        from transformer_kit.export.manifest import Manifest

        return Manifest
    raise AttributeError(f"module 'transformer_kit.export' has no attribute {name!r}")
