"""The gpt2 family: GPT2LMHeadModel checkpoints equal transformers in PyTorch and onnxruntime."""

from __future__ import annotations

from typing import ClassVar

import transformers as hf

from tests.plugins.families import parity


def _gpt2(n_embd, n_head, n_layer, **extra):
    return hf.GPT2LMHeadModel(hf.GPT2Config(
        vocab_size=parity.VOCAB, n_positions=40, n_embd=n_embd, n_head=n_head, n_layer=n_layer,
        bos_token_id=1, eos_token_id=2, **extra))


class TestGPT2(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        "gpt2-3heads-1layer": lambda: _gpt2(12, 3, 1),
        "gpt2-5heads-3layers-relu": lambda: _gpt2(20, 5, 3, activation_function="relu", n_inner=28),
    }
