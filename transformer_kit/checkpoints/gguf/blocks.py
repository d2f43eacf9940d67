"""A weight matrix kept as the GGUF file stores it, so an int4 export can write the file's own
blocks rather than quantizing the dequantized weights a second time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GgufBlocks:
    """One (N, K) weight matrix in the GGUF file's quantized blocks along each row.

    Attributes:
        type_name: the GGML type's name as the ``gguf`` package spells it (``"Q4_0"``, ``"Q4_1"``,
            ``"Q4_K"``, ``"Q6_K"``, ``"Q8_0"``, ...).
        data: (N, row_bytes) uint8, the rows in the kit's order (llama.cpp's Q/K row permutation
            undone: a permutation of whole rows, so the blocks are unchanged).
        shape: (N, K) of the float matrix the blocks stand for (``x @ W.T`` reads W).
    """

    type_name: str
    data: np.ndarray
    shape: tuple[int, int]
