"""Choosing onnxruntime execution providers: CUDA where a CUDA session really works, else CPU."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import onnxruntime as ort

from transformer_kit.core.errors import InputError, ProviderError

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
_DEFAULT_SEVERITY = 2  # onnxruntime's default: warnings and above


def _probe_model() -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


@functools.cache
def cuda_works() -> bool:
    """True when a CUDA session can really be created here (checked once, quietly).

    onnxruntime-gpu lists CUDA as available even without CUDA/cuDNN, then logs native errors
    and falls back to the CPU; so ask a tiny session which providers it got, with logging
    silenced for that one attempt.
    """
    if CUDA not in ort.get_available_providers():
        return False
    options = ort.SessionOptions()
    options.log_severity_level = 4
    ort.set_default_logger_severity(4)
    try:
        session = ort.InferenceSession(_probe_model(), options, providers=[CUDA, CPU])
        return session.get_providers()[0] == CUDA
    except Exception:
        return False
    finally:
        ort.set_default_logger_severity(_DEFAULT_SEVERITY)


def resolve_providers(providers: str | Sequence) -> list:
    """``"auto"`` -> CUDA then CPU where CUDA works, else CPU; ``"cpu"``/``"cuda"``; or a list
    passed through as onnxruntime takes it (names or (name, options) pairs)."""
    if isinstance(providers, str):
        choice = providers.lower()
        if choice == "auto":
            return [CUDA, CPU] if cuda_works() else [CPU]
        if choice == "cpu":
            return [CPU]
        if choice == "cuda":
            if not cuda_works():
                raise ProviderError(
                    "providers='cuda' was asked for, but no CUDA session can be created here "
                    "(onnxruntime-gpu needs CUDA 13 and cuDNN 9 and a GPU). Use providers='auto' "
                    "to fall back to the CPU."
                )
            return [CUDA, CPU]
        raise InputError(f"providers={providers!r} is not one of 'auto', 'cpu', 'cuda' or a list "
                          "of onnxruntime provider names.")
    providers = list(providers)
    available = set(ort.get_available_providers())
    for entry in providers:
        name = entry[0] if isinstance(entry, (tuple, list)) else entry
        if name not in available:
            raise ProviderError(f"Provider {name!r} is not available in this onnxruntime; "
                              f"available: {', '.join(sorted(available))}.")
    return providers


def exact_float32(providers: list, dtype: str) -> list:
    """``providers`` with CUDA's TF32 turned off for a float32 export where CUDA is named
    without options: onnxruntime's CUDA provider multiplies float32 matrices in TF32 by
    default (10-bit mantissas on Ampere and later), about 1e-3 relative error where the CPU
    gives 1e-7. A float16 export, or CUDA given with options of its own, is left as given."""
    if dtype != "float32":
        return providers
    return [(CUDA, {"use_tf32": "0"}) if entry == CUDA else entry for entry in providers]
