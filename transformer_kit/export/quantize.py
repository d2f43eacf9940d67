"""Weight quantization of exported graphs with onnxruntime's quantizers.

- ``"int8"``: dynamic int8 (``MatMulInteger`` with activations quantized per call, each row
  with its own scale: :mod:`~transformer_kit.export.row_activations`).
- ``"int4"`` or :class:`Int4`: 4-bit weight-only blocks (onnxruntime's ``MatMulNBits`` and
  ``GatherBlockQuantized``, as onnxruntime-genai writes them), done tensor by tensor as the
  weights are written (``weight_writer.py``). Every ``MatMul`` with a constant weight is
  quantized, the token embedding unless ``embedding=False``, the output head unless
  ``head=False``; the roles ``eight_bit`` names in 8-bit blocks.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from transformer_kit.core.errors import InputError
from transformer_kit.export.int4_nodes import SEARCH_FACTORS
from transformer_kit.export.weight_exprs import router_matmuls

BLOCK_SIZES = (16, 32, 64, 128, 256)
ACCURACY_LEVELS = (0, 1, 2, 3, 4)
#: How each block's scale is chosen (``transformer_kit.export.int4_nodes.quantize_rows``).
ROUNDINGS = {"search": "the scale of least squared error among candidates, per block",
             "nearest": "the scale from the block's largest magnitude, weights rounded to nearest "
                        "(onnxruntime's quantizer)"}
#: Weights ``Int4(eight_bit=...)`` can keep in 8-bit blocks, by role.
EIGHT_BIT_ROLES = {"embedding": "the token embedding table (and a tied head, which reads it)",
                   "head": "the output head (and the embedding table, when tied)",
                   "value": "the attention's value projections (v_proj)",
                   "down": "the feed-forward's output projections (down, linear2)",
                   "early": "every product of each stack's first eighth of layers (layer i of n "
                            "with i < n / 8: at least the first)"}


#: The most tokens of the default calibration text (or of random ids) the model runs; a user's
#: text runs whole. What the weighting finds is settled by a few hundred tokens, so more would
#: only cost products (docs/benchmarks/history.md, "4-bit weights that keep their quality").
DEFAULT_TOKENS = 512


@dataclass(frozen=True)
class Int4:
    """4-bit weight-only quantization (``MatMulNBits``).

    Args:
        block_size: weights per scale along the input dimension (16..256, a power of 2).
        accuracy_level: the type ``MatMulNBits`` computes in on the CPU: 4 = int8 activations
            (fastest on x86, as onnxruntime-genai's int4 models), 1 = float32, 0 = the
            kernel's default. CUDA ignores it.
        symmetric: a scale per block (zero point 8, the default) rather than a scale and a zero
            point. Calibrated, asymmetric blocks are a little better but onnxruntime's kernels
            run them slower on AVX2 CPUs (at the same speed with AVX-512 VNNI). 8-bit blocks are
            always symmetric.
        head: also quantize the output head (the vocabulary projection). It is the largest
            single matrix of small models; onnxruntime-genai quantizes it too.
        embedding: also quantize the token embedding (``GatherBlockQuantized``, blocks along
            the hidden dimension, when it is a multiple of ``block_size``); a tied head then
            reads the same 4-bit bytes. False keeps the table in float32.
        rounding: ``"search"`` (each block's scale chosen among candidates for the least
            squared error, the integers refitted: never worse than nearest rounding, block by
            block, at no cost when running) or ``"nearest"`` (onnxruntime's quantizer).
        eight_bit: roles of weights kept in 8-bit blocks (symmetric, same block size) instead of
            4: any of ``"embedding"``, ``"head"``, ``"value"``, ``"down"``, ``"early"`` (see
            :data:`EIGHT_BIT_ROLES`), or ``()`` for 4 bits everywhere. A packed q/k/v product
            holding a value projection is 8-bit as a whole. 8-bit products run on onnxruntime's
            packed kernel at accuracy level 4; below it they are written as float32 MatMuls of
            the 8-bit values (onnxruntime 1.31's CPU kernel dequantizes an 8-bit matrix on every
            call there), the embedding table staying 8-bit.
        calibration: the text the search weighs each column's error by (its mean squared input
            there, llama.cpp's importance matrix: :mod:`~transformer_kit.export.calibration`):
            ``"default"`` (the first :data:`DEFAULT_TOKENS` tokens of a few pages of mixed text
            shipped with the kit; random ids for a model without a tokenizer), a string of
            text, a UTF-8 text file (a ``Path``), token ids (a tuple of ints), or None (every
            column alike). Only ``rounding="search"`` weighs; with ``"nearest"`` the default
            means None, and so it does for a speech model (its encoder reads audio features,
            which the export has none of: :func:`~transformer_kit.export.calibration.calibration_for`).

    The defaults (blocks of 32, accuracy level 4, symmetric, head and embedding quantized,
    ``rounding="search"``, ``eight_bit=("embedding", "early")``, the default calibration) are
    the best trade of perplexity, folder size and decoding speed found on SmolLM2-135M-Instruct;
    each option's figures are in BENCHMARKS.md and docs/benchmarks/history.md ("4-bit weights
    that keep their quality"). The first eighth of the layers in 8 bits buys nearly what every
    down projection does, in fewer bytes: an error in the first layers reaches every later one.
    ``eight_bit=("embedding", "value", "down")`` is better and slower, ``eight_bit=("embedding",)``
    faster and worse; ``Int4(rounding="nearest", eight_bit=())`` is plain nearest rounding in 4
    bits everywhere.
    """

    block_size: int = 32
    accuracy_level: int = 4
    symmetric: bool = True
    head: bool = True
    embedding: bool = True
    rounding: str = "search"
    eight_bit: tuple[str, ...] = ("embedding", "early")
    calibration: str | Path | tuple[int, ...] | None = "default"

    def __post_init__(self) -> None:
        if isinstance(self.block_size, bool) or self.block_size not in BLOCK_SIZES:
            raise InputError(f"Int4 block_size={self.block_size!r} is not supported; choose one of "
                             f"{', '.join(map(str, BLOCK_SIZES))} (default 32).")
        if isinstance(self.accuracy_level, bool) or self.accuracy_level not in ACCURACY_LEVELS:
            raise InputError(f"Int4 accuracy_level={self.accuracy_level!r} is not supported; choose "
                             "0 (kernel default), 1 (float32), 2 (float16), 3 (bfloat16) or 4 (int8).")
        for name in ("symmetric", "head", "embedding"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"Int4 {name}={getattr(self, name)!r} must be True or False.")
        if not isinstance(self.rounding, str) or self.rounding not in ROUNDINGS:
            raise InputError(f"Int4 rounding={self.rounding!r} is not supported; choose "
                             + " or ".join(f"{k!r} ({v})" for k, v in ROUNDINGS.items()) + ".")
        roles = (self.eight_bit,) if isinstance(self.eight_bit, str) else self.eight_bit
        if (not isinstance(roles, (tuple, list)) or not all(isinstance(r, str) for r in roles)
                or set(roles) - set(EIGHT_BIT_ROLES)):
            raise InputError(f"Int4 eight_bit={self.eight_bit!r} is not supported; give a tuple of "
                             f"roles among {', '.join(map(repr, EIGHT_BIT_ROLES))} (e.g. "
                             "eight_bit=('embedding', 'early')), or () for 4 bits everywhere.")
        object.__setattr__(self, "eight_bit", tuple(r for r in EIGHT_BIT_ROLES if r in roles))
        object.__setattr__(self, "calibration", _calibration(self.calibration, self.rounding))

    def describe(self) -> dict[str, Any]:
        """The options as the manifest records them, with the candidate scales the search tried
        (so that an export made by a kit that searched others is told apart)."""
        factors = list(SEARCH_FACTORS) if self.rounding == "search" else []
        return {"method": "int4", **asdict(self), "calibration": _described(self.calibration),
                "search_factors": factors}


def _calibration(given: Any, rounding: str) -> str | Path | tuple[int, ...] | None:
    """``Int4``'s calibration checked: "default", a text, a file's Path, ids as a tuple, or None."""
    if given is None or (isinstance(given, str) and given == "default" and rounding == "nearest"):
        return None
    if rounding == "nearest":
        raise InputError("Int4 calibration weighs the scale search's errors, and rounding='nearest' "
                         "does not search: use rounding='search' (the default), or leave calibration out.")
    if isinstance(given, os.PathLike):
        path = Path(given)
        if not path.is_file():
            raise InputError(f"Int4 calibration file {str(path)!r} does not exist or is not a file; "
                             "give a UTF-8 text file, a string of text, token ids, or None.")
        return path
    if isinstance(given, str):
        if not given.strip():
            raise InputError("Int4 calibration text is empty; give some text, or 'default'.")
        return given
    if hasattr(given, "tolist"):  # numpy or torch ids
        given = given.tolist()
    if isinstance(given, (list, tuple)) and given and all(
            isinstance(i, int) and not isinstance(i, bool) for i in given):
        return tuple(given)
    raise InputError(f"Int4 calibration={given!r:.60} is not supported; give 'default', a string of "
                     "text, a pathlib.Path to a UTF-8 text file, token ids (a list of ints), or None.")


def _described(calibration: str | Path | tuple[int, ...] | None) -> str | None:
    """The calibration as the manifest records it (not the whole text)."""
    if calibration is None:
        return None
    if calibration == "default":
        return f"default ({DEFAULT_TOKENS} tokens)"
    if isinstance(calibration, Path):
        return f"file {calibration.name}"
    if isinstance(calibration, tuple):
        return f"{len(calibration)} token ids"
    digest = hashlib.sha256(calibration.encode()).hexdigest()[:12]
    return f"text of {len(calibration)} characters (sha256 {digest})"


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
    loggers = [logging.getLogger(), logging.getLogger("onnxruntime.quantization")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def quantize_graph(path: Path, external: bool) -> None:
    """Quantize the graph file ``path`` in place with dynamic int8 (int4 is done by the weight
    writer, tensor by tensor); the routers of mixtures of experts stay float."""
    import onnx
    import onnx_ir as ir
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from transformer_kit.export.row_activations import quantize_rows

    quantized = path.with_suffix(".int8.onnx")
    routers = [node.name for node in router_matmuls(ir.load(path).graph)]  # kept float
    with _quiet_root_logger():
        # Weights of MatMul/Gemm only: the quantizer would misread ONNX's Attention op as
        # onnxruntime's contrib op of the same name. reduce_range keeps the int8 weights in
        # [-64, 64]: x86 CPUs without VNNI (AVX2, AVX-512 without VNNI) multiply uint8
        # activations by int8 weights with VPMADDUBSW, which sums adjacent pairs into int16 and
        # saturates above 32767 (255 * (127 + 127) would); with 7-bit weights a pair stays at
        # or below 255 * 128 = 32640, so every CPU computes the same exact integer products.
        # A scale per output column wins back the bit: 7-bit weights so scaled agree with
        # float32 at least as well as full-range per-tensor ones.
        quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8, reduce_range=True,
                         per_channel=True, op_types_to_quantize=["MatMul", "Gemm"],
                         nodes_to_exclude=routers, use_external_data_format=external)
    # One activation scale per row instead of per tensor: a row's product no longer depends on
    # the other rows of its batch (greedy decoding alone = in a batch).
    graph = onnx.load(str(quantized), load_external_data=False)
    quantize_rows(graph)
    onnx.save(graph, str(quantized))
    quantized.replace(path)
    data = path.with_name(path.name + ".data")
    if data.exists() and not external:
        data.unlink()
