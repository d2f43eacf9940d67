"""Choosing providers: a float32 export on CUDA multiplies in float32, not TF32."""

from __future__ import annotations

from transformer_kit.runtime.providers import CPU, CUDA, exact_float32


def test_float32_exports_turn_tf32_off_where_cuda_is_named_without_options():
    assert exact_float32([CUDA, CPU], "float32") == [(CUDA, {"use_tf32": "0"}), CPU]
    assert exact_float32([CUDA, CPU], "float16") == [CUDA, CPU]  # half precision: as given
    own = (CUDA, {"device_id": "1"})
    assert exact_float32([own, CPU], "float32") == [own, CPU]  # the user's options stand
    assert exact_float32([CPU], "float32") == [CPU]
