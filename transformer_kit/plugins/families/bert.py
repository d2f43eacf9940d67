"""BERT (``BertModel``, the last hidden state; ``BertForSequenceClassification``, a
cross-encoder's scores): encoder, post_norm, learned positions with token types, a norm after
the embeddings, exact GELU; the classifier is the pooler (dense + tanh on [CLS]) and a linear
layer to the labels."""

from __future__ import annotations

from transformer_kit import CheckpointFamily, ModelConfig
from transformer_kit.checkpoints import StateDict, Weights, copy_attention, copy_linear, require
from transformer_kit.checkpoints.sentence_transformers import activation_name
from transformer_kit.plugins.feedforward import feedforward_for_activation


def classifier_config(hf: dict) -> dict | None:
    """The ``classifier`` of a ``*ForSequenceClassification`` checkpoint (None for others):
    its labels, and the score activation sentence-transformers 3 kept in config.json."""
    if not any(str(a).endswith("ForSequenceClassification") for a in hf.get("architectures") or []):
        return None
    labels = hf.get("id2label") or {}
    count = hf.get("num_labels") or len(labels) or 2
    names = [str(labels.get(str(i), labels.get(i, f"LABEL_{i}"))) for i in range(count)]
    config = {"num_labels": count, "labels": names}
    activation = (hf.get("sentence_transformers") or {}).get("activation_fn")
    if activation is not None:
        config["activation"] = activation_name(activation, "config.json's sentence_transformers")
    return config


def bert_config(hf: dict, family: str = "bert") -> dict:
    """The config of a BERT-layout checkpoint (also RoBERTa's); ``family`` names it in refusals."""
    require(hf.get("position_embedding_type", "absolute") == "absolute", family,
            f"position_embedding_type {hf.get('position_embedding_type')!r}")
    require(not hf.get("is_decoder"), family, "is_decoder")
    vocab = hf["vocab_size"]
    return {
        "architecture": "encoder", "vocab_size": vocab, "d_model": hf["hidden_size"],
        "num_heads": hf["num_attention_heads"], "num_layers": hf["num_hidden_layers"],
        "d_ff": hf["intermediate_size"], "dropout": hf.get("hidden_dropout_prob", 0.1),
        "max_len": hf["max_position_embeddings"], "pad_id": hf.get("pad_token_id", 0),
        "bos_id": None, "eos_id": None,  # an encoder does not generate
        "tie_embeddings": False, "scale_embeddings": False, "attention_bias": True,
        "embedding_norm": True, "attention": "sdpa",
        "positional": {"name": "learned", "token_types": hf.get("type_vocab_size", 2)},
        "mask": "none", "block": "post_norm",
        "feedforward": feedforward_for_activation(hf.get("hidden_act", "gelu"), family),
        "norm": {"name": "layernorm", "eps": hf.get("layer_norm_eps", 1e-12)},
        **({"classifier": classifier} if (classifier := classifier_config(hf)) else {}),
    }


def bert_weights(hf: dict, w: Weights, cfg: ModelConfig) -> StateDict:
    out: StateDict = {
        "embed.token.weight": w.get("embeddings.word_embeddings.weight"),
        "embed.positional.table.weight": w.get("embeddings.position_embeddings.weight"),
        "embed.positional.token_type.weight": w.get("embeddings.token_type_embeddings.weight"),
    }
    copy_linear(out, "embed.norm", w, "embeddings.LayerNorm")
    for i in range(cfg.num_layers):
        ours, theirs = f"encoder.layers.{i}", f"encoder.layer.{i}"
        copy_attention(out, f"{ours}.self_attention", w, f"{theirs}.attention",
                       ("self.query", "self.key", "self.value", "output.dense"), True)
        copy_linear(out, f"{ours}.self_norm", w, f"{theirs}.attention.output.LayerNorm")
        copy_linear(out, f"{ours}.feedforward.linear1", w, f"{theirs}.intermediate.dense")
        copy_linear(out, f"{ours}.feedforward.linear2", w, f"{theirs}.output.dense")
        copy_linear(out, f"{ours}.ff_norm", w, f"{theirs}.output.LayerNorm")
    if cfg.classifier is not None:  # BertForSequenceClassification: pooler, then classifier
        copy_linear(out, "classifier.pooler", w, "pooler.dense")
        copy_linear(out, "classifier.out", w, "classifier")
    return out


FAMILY = CheckpointFamily("bert", bert_config, bert_weights, probe="embeddings.word_embeddings.weight",
                          prefixes=("", "bert."),
                          description="BertModel (last hidden state), BertForSequenceClassification (scores)")
