"""ONNX export and the onnxruntime runtime (filled by the export issue)."""
