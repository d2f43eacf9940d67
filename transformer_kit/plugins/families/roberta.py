"""RoBERTa (``RobertaModel``, the last hidden state; ``RobertaForSequenceClassification``):
BERT's mapping with positions counted over real tokens from ``padding_idx + 1`` (``learned``
with ``offset``) and RoBERTa's single token type added everywhere; the classification head's
dense + tanh on the first token and ``out_proj``."""

from __future__ import annotations

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, copy_linear, require
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


def roberta_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    classifier = cfg.classifier
    out = bert_weights(hf, w, cfg.model_copy(update={"classifier": None}) if classifier else cfg)
    if classifier is not None:  # RobertaClassificationHead: dense + tanh, then out_proj
        copy_linear(out, "classifier.pooler", w, "classifier.dense")
        copy_linear(out, "classifier.out", w, "classifier.out_proj")
    return out


FAMILY = CheckpointFamily("roberta", roberta_config, roberta_weights,
                          probe="embeddings.word_embeddings.weight", prefixes=("", "roberta."),
                          description="RobertaModel (last hidden state), "
                          "RobertaForSequenceClassification (scores)")
