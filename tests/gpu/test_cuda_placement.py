"""No CPU fallback: every node of every graph the kit exports (float32, float16, int4; decoder,
encoder, encoder-decoder) that computes on activations or weights runs on CUDA.

onnxruntime's profile of a session names the provider of each node it ran. A model is loaded
with profiling on, runs its forward, and generates (or embeds); each session writes its profile
when it is freed. onnxruntime places small integer shape computations on the CPU on purpose (its
"CPU-preferred" nodes, whose outputs only feed shapes); those are allowed, any node with a float
output on the CPU is not.
"""

from __future__ import annotations

import gc
import json

import numpy as np
import onnxruntime as ort
import pytest

from tests.gpu.conftest import DRY_RUN, MODELS, PRECISIONS, TARGET, TARGET_LAYOUT
from transformer_kit.runtime import OnnxModel

PROVIDER = "CPUExecutionProvider" if DRY_RUN else "CUDAExecutionProvider"
INTEGER_TYPES = {"int64", "int32", "int8", "uint8", "bool"}


def run_everything(model: OnnxModel, name: str) -> None:
    ids = np.random.default_rng(0).integers(3, model.manifest.src_vocab, (2, 7))
    if name == "encoder":
        model.encode(ids.tolist())
        model(ids)
    elif name == "decoder":
        model(ids)
        model.generate(ids, max_new_tokens=4, min_new_tokens=4)
    else:
        model(ids, ids[:, :3] % model.manifest.tgt_vocab)
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, num_beams=2)


def node_events(prefix) -> list[dict]:
    events = []
    for file in sorted(prefix.parent.glob(prefix.name + "*.json")):
        events += [e for e in json.loads(file.read_text())
                   if e.get("cat") == "Node" and "provider" in e.get("args", {})]
    return events


def float_outputs(event: dict) -> list[str]:
    """The element types of a node event's outputs that are not integers."""
    return [kind for shape in event["args"].get("output_type_shape", []) for kind in shape
            if kind not in INTEGER_TYPES]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", list(MODELS))
def test_every_computing_node_runs_on_cuda(exports, name, precision, tmp_path):
    _, folder = exports(name, precision)
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    model = OnnxModel(folder, TARGET, session_options=options, cache_layout=TARGET_LAYOUT)
    run_everything(model, name)
    del model
    gc.collect()  # each session writes its profile when it is freed
    events = node_events(tmp_path / "profile")
    assert len(events) > 10  # the profiles were written and hold the graphs' nodes
    elsewhere = sorted({(e["args"]["op_name"], e["name"], *float_outputs(e)) for e in events
                        if e["args"]["provider"] != PROVIDER and float_outputs(e)})
    assert not elsewhere, f"nodes with float outputs not on {PROVIDER}: {elsewhere}"
