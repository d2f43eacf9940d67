"""RoBERTa (``RobertaModel``, the last hidden state): BERT's mapping with positions counted
over real tokens from ``padding_idx + 1`` (``learned`` with ``offset``) and RoBERTa's single
token type added everywhere."""

from __future__ import annotations

from transformer_kit import CheckpointFamily
from transformer_kit.checkpoints import require
from transformer_kit.plugins.families.bert import bert_config, bert_weights


def roberta_config(hf: dict) -> dict:
    config = bert_config(hf, "roberta")
    pad = hf.get("pad_token_id", 1)
    require(isinstance(pad, int) and pad >= 0, "roberta", f"pad_token_id {pad!r} (positions start after it)")
    offset = pad + 1
    require(hf["max_position_embeddings"] > offset, "roberta",
            f"max_position_embeddings {hf['max_position_embeddings']} (not above padding_idx + 1)")
    config["max_len"] = hf["max_position_embeddings"] - offset
    config["positional"] = {"name": "learned", "token_types": hf.get("type_vocab_size", 1),
                            "offset": offset}
    return config


FAMILY = CheckpointFamily("roberta", roberta_config, bert_weights, probe="embeddings.word_embeddings.weight",
                          prefixes=("", "roberta."), description="RobertaModel (last hidden state)")
