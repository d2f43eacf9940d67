"""XLM-RoBERTa (``XLMRobertaModel``, ``XLMRobertaForSequenceClassification``): RoBERTa's
layout and mapping under its own ``model_type`` (multilingual embedders and rerankers)."""

from __future__ import annotations

from transformer_kit import CheckpointFamily
from transformer_kit.plugins.families.roberta import roberta_config, roberta_weights

FAMILY = CheckpointFamily("xlm-roberta", roberta_config, roberta_weights,
                          probe="embeddings.word_embeddings.weight", prefixes=("", "roberta."),
                          description="XLMRobertaModel (last hidden state), "
                          "XLMRobertaForSequenceClassification (scores)")
