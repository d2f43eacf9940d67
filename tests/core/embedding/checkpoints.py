"""sentence-transformers folders made here: a random BERT or RoBERTa body (transformers'
save_pretrained) with a WordPiece tokenizer trained here, wrapped in sentence-transformers'
own modules (Transformer, Pooling, Dense, Normalize) and written with its own ``save``; and a
random cross-encoder (``*ForSequenceClassification`` through sentence-transformers'
``CrossEncoder``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers as hf
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

CORPUS = ["the quick brown fox jumps over the lazy dog", "search engines rank documents by relevance",
          "query: what is the capital of france", "passage: paris is the capital of france",
          "Represent this sentence for searching relevant passages: cats and dogs",
          "embeddings map text to vectors; rerankers score a query against each document"] * 20
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PROMPTS = {"query": "query: ", "passage": "passage: "}


def wordpiece_tokenizer(vocab: int = 300, body: str = "bert") -> Tokenizer:
    """A lower-casing WordPiece tokenizer: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4;
    single texts as [CLS] A [SEP]; pairs as BERT's [CLS] A [SEP] B [SEP] with token types 0 / 1,
    or for ``body="roberta"`` as RoBERTa's [CLS] A [SEP] [SEP] B [SEP], all of type 0."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.train_from_iterator(CORPUS, trainers.WordPieceTrainer(vocab_size=vocab,
                                                                   special_tokens=SPECIAL))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    pair = "[CLS] $A [SEP] $B:1 [SEP]:1" if body == "bert" else "[CLS] $A [SEP] [SEP] $B [SEP]"
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair=pair,
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tokenizer


def _body_config(body: str, vocab: int, **extra) -> hf.PretrainedConfig:
    sizes = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, max_position_embeddings=128, initializer_range=0.2, **extra)
    if body == "roberta":  # positions from padding_idx + 1; pad is [PAD] 0 here
        return hf.XLMRobertaConfig(**{**sizes, "max_position_embeddings": 130}, pad_token_id=0,
                                   bos_token_id=2, eos_token_id=3, type_vocab_size=1)
    return hf.BertConfig(**sizes)


def _write_body(folder: Path, model: hf.PreTrainedModel, tokenizer: Tokenizer, max_length: int,
                body: str) -> None:
    """The checkpoint and its tokenizer; BERT's tokenizer class gives token types, RoBERTa's
    (the generic fast tokenizer) none."""
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    kind = "BertTokenizerFast" if body == "bert" else "PreTrainedTokenizerFast"
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": kind, "pad_token": "[PAD]", "cls_token": "[CLS]",
        "sep_token": "[SEP]", "unk_token": "[UNK]", "mask_token": "[MASK]",
        "model_max_length": max_length, "do_lower_case": True}))


def write_sentence_transformer(folder: Path, *, body: str = "bert", pooling: str = "mean",
                               dense: int | None = None, normalize: bool = False,
                               include_prompt: bool = True, max_seq_length: int = 64,
                               seed: int = 0):
    """A random sentence-transformers model saved in ``folder``; returns it (a
    ``SentenceTransformer``, the reference). ``dense``: a Dense layer to that width (tanh)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    body_folder = folder.parent / f"{folder.name}-body"
    tokenizer = wordpiece_tokenizer()
    torch.manual_seed(seed)
    model = hf.AutoModel.from_config(_body_config(body, tokenizer.get_vocab_size()))
    _write_body(body_folder, model, tokenizer, max_seq_length, body)
    modules = [Transformer(str(body_folder), max_seq_length=max_seq_length),
               Pooling(32, pooling, include_prompt=include_prompt)]
    if dense is not None:
        modules.append(Dense(32, dense))
    if normalize:
        modules.append(Normalize())
    st = SentenceTransformer(modules=modules, prompts=PROMPTS, device="cpu")
    st.save(str(folder))
    return SentenceTransformer(str(folder), device="cpu")


def write_cross_encoder(folder: Path, *, body: str = "bert", num_labels: int = 1,
                        max_length: int = 64, seed: int = 0):
    """A random cross-encoder saved in ``folder``; returns it (a ``CrossEncoder``)."""
    from sentence_transformers import CrossEncoder

    body_folder = folder.parent / f"{folder.name}-body"
    tokenizer = wordpiece_tokenizer(body=body)
    torch.manual_seed(seed)
    config = _body_config(body, tokenizer.get_vocab_size(), num_labels=num_labels)
    model = hf.AutoModelForSequenceClassification.from_config(config)
    _write_body(body_folder, model, tokenizer, max_length, body)
    CrossEncoder(str(body_folder), device="cpu").save(str(folder))
    return CrossEncoder(str(folder), device="cpu")
