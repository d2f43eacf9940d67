"""The GPU tests: exports run on onnxruntime's CUDA provider against the same export on the CPU
and against PyTorch. They run where onnxruntime has a working CUDA provider (a lent GPU machine:
``benchmarks/gpu_session.sh``) and are skipped with a sentence elsewhere.

``TK_GPU_DRY_RUN=1`` runs them on the CPU provider in place of CUDA: a check of the tests' own
code before a GPU session spends its minutes on them (every comparison then holds trivially).

The models, each exported once per session in float32, float16 and int4 (by the kit, on the
CPU, as a user would before serving on a GPU):

- ``decoder``: Llama-like, grouped KV heads (4 -> 2), rotary positions, RMSNorm, SwiGLU;
- ``encoder``: BERT-like with mean pooling and a normalized sentence embedding;
- ``encoder_decoder``: the paper's, with separate source and target vocabularies.

Precisions: float32, float16, int4 (float32 activations) and "int4 float16" (the same blocks with
float16 activations and scales).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import transformer_kit as tk
from transformer_kit.export import Int4, export_onnx
from transformer_kit.runtime.providers import cuda_works

DRY_RUN = os.environ.get("TK_GPU_DRY_RUN") == "1"
#: The provider the tests put on trial ("cuda"; "cpu" in a dry run).
TARGET = "cpu" if DRY_RUN else "cuda"
#: The cache layout CUDA runs (``"auto"`` there); the CPU's own, the shared buffer, in a dry run
#: would check another path than the one the GPU runs.
TARGET_LAYOUT = "left_padded" if DRY_RUN else "auto"
#: "int4 float16": int4 blocks with float16 activations and scales (the GPU's usual 4-bit form).
PRECISIONS = ("float32", "float16", "int4", "int4 float16")
COMMON = {"d_model": 64, "num_heads": 4, "num_kv_heads": 2, "num_layers": 2, "d_ff": 128,
          "dropout": 0.0, "max_len": 128, "pad_id": 0}
MODELS = {
    "decoder": {**COMMON, "architecture": "decoder", "vocab_size": 96, "bos_id": 1, "eos_id": 2,
                "attention": "sdpa", "positional": "rotary", "norm": "rmsnorm",
                "feedforward": "swiglu", "block": "pre_norm", "tie_embeddings": False},
    "encoder": {**COMMON, "architecture": "encoder", "vocab_size": 96, "attention": "sdpa",
                "positional": "learned", "feedforward": "gelu", "pooling": "mean",
                "sentence_embedding": {"normalize": True}},
    "encoder_decoder": {**COMMON, "architecture": "encoder_decoder", "src_vocab_size": 80,
                        "tgt_vocab_size": 72, "bos_id": 1, "eos_id": 2, "tie_embeddings": False},
}


def pytest_collection_modifyitems(config, items):
    """Every test under tests/gpu is skipped, with the reason, where CUDA does not work."""
    if DRY_RUN or cuda_works():
        return
    skip = pytest.mark.skip(reason="no working CUDA provider in this onnxruntime (onnxruntime-gpu "
                            "with CUDA 13, cuDNN 9 and a GPU): the GPU tests run on a lent GPU "
                            "machine (benchmarks/gpu_session.sh), or on the CPU with TK_GPU_DRY_RUN=1")
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(skip)


def build(name: str) -> tk.TransformerModel:
    """The float32 PyTorch model ``name`` of :data:`MODELS`, seeded."""
    torch.manual_seed(0)
    return tk.build_model(MODELS[name]).eval()


@pytest.fixture(scope="session")
def exports(tmp_path_factory):
    """``exports(name, precision) -> (model, folder)``: each made once, verified by the export."""
    made: dict[tuple[str, str], tuple[tk.TransformerModel, Path]] = {}
    models: dict[str, tk.TransformerModel] = {}

    def get(name: str, precision: str) -> tuple[tk.TransformerModel, Path]:
        if (name, precision) not in made:
            model = models.setdefault(name, build(name))
            folder = tmp_path_factory.mktemp(f"{name}-{precision.replace(' ', '-')}")
            export_onnx(model, folder, dtype="float16" if precision.endswith("float16") else "float32",
                        quantize=Int4() if precision.startswith("int4") else None)
            made[name, precision] = model, folder
        return made[name, precision]
    return get
