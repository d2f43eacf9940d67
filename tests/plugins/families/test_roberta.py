"""The roberta family: RobertaModel checkpoints (last hidden state; positions from padding_idx +
1 over real tokens) equal transformers in PyTorch and onnxruntime."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.plugins.families import parity


def _roberta(hidden, heads, layers, **extra):
    return hf.RobertaModel(hf.RobertaConfig(
        vocab_size=parity.VOCAB, hidden_size=hidden, num_attention_heads=heads,
        num_hidden_layers=layers, intermediate_size=2 * hidden + 3, **extra), add_pooling_layer=False)


class TestRoberta(parity.FamilyParity):
    CHECKPOINTS: ClassVar = {
        "roberta-3heads-1layer-pad1": lambda: _roberta(12, 3, 1, max_position_embeddings=42),
        "roberta-5heads-3layers-pad3-gelu-tanh": lambda: _roberta(
            20, 5, 3, pad_token_id=3, max_position_embeddings=40, hidden_act="gelu_new", type_vocab_size=2),
    }


def test_positions_start_after_the_padding_id_and_skip_padding(tmp_path):
    """Left and right padding give each real token the position transformers gives it (counted
    from padding_idx + 1 over real tokens): outputs at real tokens equal, either side."""
    reference = _roberta(12, 3, 1, max_position_embeddings=42).eval()
    reference.save_pretrained(tmp_path)
    model = tk.from_hf(tmp_path)
    assert model.config.max_len == 40 and model.config.positional.params["offset"] == 2
    ids = torch.randint(3, parity.VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    ids[0, :3] = 1  # left padding
    ids[1, 5:] = 1  # right padding
    mask = (ids != 1).long()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        ours = model(ids)
    real = mask.bool()
    assert parity.relative_error(ours[real], expected[real]) <= parity.TOLERANCE


def test_a_relative_position_embedding_is_refused_naming_the_field(tmp_path):
    _roberta(12, 3, 1, position_embedding_type="relative_key").save_pretrained(tmp_path)
    with pytest.raises(tk.CheckpointError, match="roberta checkpoint with position_embedding_type"):
        tk.from_hf(tmp_path)
