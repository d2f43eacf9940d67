"""GGUF files (llama.cpp, Ollama) as assembled models.

    model = tk.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")   # dequantized to float32
    model.gguf_blocks["decoder.layers.0.self_attention.q_proj.weight"]   # the file's own blocks

Reading needs the ``gguf`` package (``pip install 'transformer-kit[gguf]'``), imported only
when a file is opened.
"""

from __future__ import annotations

from transformer_kit.checkpoints.gguf.blocks import GgufBlocks
from transformer_kit.checkpoints.gguf.loading import config_from_gguf, from_gguf

__all__ = ["GgufBlocks", "config_from_gguf", "from_gguf"]
