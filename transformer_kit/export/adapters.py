"""LoRA adapters exported beside the base weights and bound per call, as onnxruntime-genai's
Adapters API binds them: each adapted matrix product ``y = x @ W`` of the graphs becomes
``y = x @ W + (x @ A) @ B`` with ``A`` (in_features, rank) and ``B`` (rank, out_features) graph
inputs whose defaults are empty (rank 0: the product adds zeros, the base runs as before). An
adapter is a file ``adapters/NAME.safetensors`` of those inputs' values; ``OnnxModel`` feeds them
when a call names the adapter.

A packed product (the kit writes q, k and v as one matrix, gate and up as another) takes the
concatenation of its parts' ``A`` and a block-diagonal ``B`` (zero where a part is not
adapted), so each part gets exactly its own ``b @ a``. The adapter's scale is in ``B``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from transformer_kit.core.errors import ExportError
from transformer_kit.runtime.adapters import ADAPTER_FOLDER, check_adapter_names

if TYPE_CHECKING:  # torch is the caller's (the export), not imported here
    from torch import Tensor

#: The graphs whose products take the adapters' inputs (the forward and the decoding step).
ADAPTED_GRAPHS = ("model", "decoder_step")
_WEIGHT = re.compile(r"(?P<pre>[^{}]*?)(?:\{(?P<parts>[^{}]+)\})?(?P<post>[^{}]*\.weight)\.transposed")


def _packed_parameters(weight_input: str) -> list[str] | None:
    """The kit parameters a product's weight input packs, in their column order, or None."""
    found = _WEIGHT.fullmatch(weight_input)
    if found is None:
        return None
    parts = found["parts"].split(",") if found["parts"] else [""]
    return [f"{found['pre']}{part}{found['post']}" for part in parts]


def add_adapters(folder: Path, files: dict[str, str], adapters: dict[str, dict[str, tuple[Tensor, Tensor]]],
                 sizes: dict[str, tuple[int, int]]) -> list[str]:
    """Give graphs ``files`` (by graph name) of export ``folder`` an ``A`` and ``B`` input on
    every product of a parameter some adapter adapts, and write each adapter's values;
    ``sizes``: each parameter's (out_features, in_features). Returns the adapters' names."""
    check_adapter_names(list(adapters))
    adapted = {name for factors in adapters.values() for name in factors}
    values: dict[str, dict[str, np.ndarray]] = {name: {} for name in adapters}
    for graph_name, file in files.items():
        if graph_name not in ADAPTED_GRAPHS:
            continue
        path = folder / file
        proto = onnx.load(str(path), load_external_data=False)
        graph, nodes = proto.graph, []
        for node in graph.node:
            product = node.op_type == "MatMul" and len(node.input) == 2
            params = _packed_parameters(node.input[1]) if product else None
            if not params or not adapted.intersection(params):
                nodes.append(node)
                continue
            stem = f"lora.{node.input[1].removesuffix('.transposed')}"
            for name, factors in adapters.items():
                values[name].update(_packed(stem, params, factors, sizes))
            inputs = (node.input[0], f"{stem}.A", f"{stem}.B")
            base, down = f"{stem}/base", f"{stem}/down"
            output = node.output[0]
            node.output[0] = base
            nodes += [node, helper.make_node("MatMul", inputs[:2], [down], name=f"{stem}/MatMulA"),
                      helper.make_node("MatMul", [down, inputs[2]], [f"{stem}/up"], name=f"{stem}/MatMulB"),
                      helper.make_node("Add", [base, f"{stem}/up"], [output], name=f"{stem}/Add")]
            d_in, d_out = sizes[params[0]][1], sum(sizes[p][0] for p in params)
            for name, shape in ((inputs[1], [d_in, 0]), (inputs[2], [0, d_out])):
                if name not in {i.name for i in graph.input}:
                    graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [
                        shape[0] or f"{stem}.rank", shape[1] or f"{stem}.rank"]))
                    graph.initializer.append(numpy_helper.from_array(np.zeros(shape, np.float32), name))
        del graph.node[:]
        graph.node.extend(nodes)
        onnx.save(proto, str(path))
    (folder / ADAPTER_FOLDER).mkdir(exist_ok=True)
    from safetensors.numpy import save_file

    for name, tensors in values.items():
        if not tensors:
            raise ExportError(f"Adapter {name!r} adapts no matrix product of the exported graphs.")
        save_file(tensors, str(folder / ADAPTER_FOLDER / f"{name}.safetensors"))
    return list(adapters)


def _packed(stem: str, params: list[str], factors: dict[str, tuple[Tensor, Tensor]],
            sizes: dict[str, tuple[int, int]]) -> dict[str, np.ndarray]:
    """The ``A`` (in, rank) and ``B`` (rank, out) of a product packing ``params`` for one
    adapter: its parts' ``a`` stacked, ``b`` block-diagonal; nothing when it adapts none."""
    parts = [(i, factors[p]) for i, p in enumerate(params) if p in factors]
    if not parts:
        return {}
    offsets = np.cumsum([0] + [sizes[p][0] for p in params])
    rank = sum(a.shape[0] for _, (a, _) in parts)
    a_in = np.concatenate([a.numpy().T for _, (a, _) in parts], axis=1).astype(np.float32)
    b_in = np.zeros((rank, int(offsets[-1])), np.float32)
    at = 0
    for i, (a, b) in parts:
        b_in[at:at + a.shape[0], offsets[i]:offsets[i + 1]] = b.numpy().T
        at += a.shape[0]
    return {f"{stem}.A": np.ascontiguousarray(a_in), f"{stem}.B": b_in}
