"""Weight quantization of exported graphs with onnxruntime's quantizers.

- ``"int8"``: dynamic int8 (``MatMulInteger`` with activations quantized per call).
- ``"int4"`` or :class:`Int4`: 4-bit weight-only blocks (onnxruntime's ``MatMulNBits``, as
  onnxruntime-genai writes them). Every ``MatMul`` with a constant weight is quantized; the
  embedding ``Gather`` keeps full precision; the output head is quantized unless ``head=False``.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import onnx

from transformer_kit.errors import InputError

BLOCK_SIZES = (16, 32, 64, 128, 256)
ACCURACY_LEVELS = (0, 1, 2, 3, 4)


@dataclass(frozen=True)
class Int4:
    """4-bit weight-only quantization (``MatMulNBits``).

    Args:
        block_size: weights per scale along the input dimension (16..256, a power of 2).
        accuracy_level: the type ``MatMulNBits`` computes in on the CPU: 4 = int8 activations
            (fastest on x86, as onnxruntime-genai's int4 models), 1 = float32, 0 = the
            kernel's default. CUDA ignores it.
        symmetric: a scale per block (zero point 8) rather than a scale and a zero point.
        head: also quantize the output head (the vocabulary projection). It is the largest
            single matrix of small models; onnxruntime-genai quantizes it too.
    """

    block_size: int = 32
    accuracy_level: int = 4
    symmetric: bool = True
    head: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or self.block_size not in BLOCK_SIZES:
            raise InputError(f"Int4 block_size={self.block_size!r} is not supported; choose one of "
                             f"{', '.join(map(str, BLOCK_SIZES))} (default 32).")
        if isinstance(self.accuracy_level, bool) or self.accuracy_level not in ACCURACY_LEVELS:
            raise InputError(f"Int4 accuracy_level={self.accuracy_level!r} is not supported; choose "
                             "0 (kernel default), 1 (float32), 2 (float16), 3 (bfloat16) or 4 (int8).")
        for name in ("symmetric", "head"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"Int4 {name}={getattr(self, name)!r} must be True or False.")

    def describe(self) -> dict[str, Any]:
        return {"method": "int4", **asdict(self)}


def quantization(quantize: Any) -> str | Int4 | None:
    """``quantize`` as given to ``export_onnx``: None, ``"int8"``, ``"int4"`` or an :class:`Int4`."""
    if quantize is None or quantize == "int8" or isinstance(quantize, Int4):
        return quantize
    if quantize == "int4":
        return Int4()
    raise InputError(f"quantize={quantize!r} is not supported; choose None, 'int8', 'int4' or "
                     "transformer_kit.export.Int4(block_size=..., accuracy_level=..., ...).")


def method(quantize: str | Int4 | None) -> str | None:
    """The quantization's name: None, ``"int8"`` or ``"int4"``."""
    return "int4" if isinstance(quantize, Int4) else quantize


@contextlib.contextmanager
def _quiet_root_logger():
    """onnxruntime's quantizers log advice and progress on the root logger and their own."""
    loggers = [logging.getLogger(), logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def quantize_graph(path: Path, quantize: str | Int4, external: bool) -> None:
    """Quantize the graph file ``path`` in place."""
    if isinstance(quantize, Int4):
        _quantize_int4(path, quantize, external)
    else:
        _quantize_int8(path, external)


def _quantize_int8(path: Path, external: bool) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = path.with_suffix(".int8.onnx")
    with _quiet_root_logger():
        # Weights of MatMul/Gemm only: the quantizer would misread ONNX's Attention op as
        # onnxruntime's contrib op of the same name. reduce_range keeps the int8 weights in
        # [-64, 64]: x86 CPUs without VNNI (AVX2, AVX-512 without VNNI) multiply uint8
        # activations by int8 weights with VPMADDUBSW, which sums adjacent pairs into int16 and
        # saturates above 32767 (255 * (127 + 127) would); with 7-bit weights a pair stays at
        # or below 255 * 128 = 32640, so every CPU computes the same exact integer products.
        # A scale per output column wins back the bit (top-1 agreement with float32 on the
        # GPT-2-shape benchmark model: 92 % against 91 % for full-range per-tensor weights).
        quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8, reduce_range=True,
                         per_channel=True, op_types_to_quantize=["MatMul", "Gemm"],
                         use_external_data_format=external)
    quantized.replace(path)
    data = path.with_name(path.name + ".data")
    if data.exists() and not external:
        data.unlink()


def head_matmuls(graph: onnx.GraphProto, output: str = "logits") -> list[str]:
    """Names of the MatMul nodes nearest to graph output ``output`` (the output head)."""
    producer = {out: node for node in graph.node for out in node.output}
    found, seen, todo = [], set(), [output]
    while todo:
        node = producer.get(todo.pop())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op_type == "MatMul":
            found.append(node.name)
        else:
            todo.extend(node.input)
    return found


def _nbits_quantizer() -> type:
    """onnxruntime's MatMulNBitsQuantizer, imported without the ``logging.basicConfig`` its
    module calls (which would send every library's INFO records to the user's terminal)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)
    return MatMulNBitsQuantizer


def transposed_weights(graph: onnx.GraphProto, skip: list[str]) -> None:
    """Give each MatMul (but those in ``skip``) that multiplies by ``Transpose(initializer)``
    the transposed matrix as an initializer of its own, so the quantizer sees a constant weight.
    A tied output head reads the embedding table this way; the ``Gather`` keeps the original."""
    from onnx import numpy_helper

    initializers = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        if node.op_type != "MatMul" or node.name in skip or len(node.input) < 2:
            continue
        transpose = producer.get(node.input[1])
        if transpose is None or transpose.op_type != "Transpose" or transpose.input[0] not in initializers:
            continue
        perm = [list(a.ints) for a in transpose.attribute if a.name == "perm"]
        matrix = numpy_helper.to_array(initializers[transpose.input[0]])
        if matrix.ndim != 2 or perm not in ([], [[1, 0]]):
            continue
        name = f"{transpose.input[0]}.transposed_for_{node.name}"
        graph.initializer.append(numpy_helper.from_array(matrix.T.copy(), name))
        node.input[1] = name
        used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
        if transpose.output[0] not in used:  # nothing else reads it: no transposed copy at load
            graph.node.remove(transpose)


def _quantize_int4(path: Path, options: Int4, external: bool) -> None:
    MatMulNBitsQuantizer = _nbits_quantizer()
    proto = onnx.load(str(path), load_external_data=True)
    exclude = [] if options.head else head_matmuls(proto.graph)
    transposed_weights(proto.graph, exclude)
    with _quiet_root_logger():
        quantizer = MatMulNBitsQuantizer(
            proto, bits=4, block_size=options.block_size, is_symmetric=options.symmetric,
            accuracy_level=options.accuracy_level, nodes_to_exclude=exclude,
            op_types_to_quantize=("MatMul",))
        quantizer.process()
    for stale in path.parent.glob(path.name + ".data"):
        stale.unlink()
    onnx.save_model(quantizer.model.model, str(path), save_as_external_data=external,
                    location=path.name + ".data")
