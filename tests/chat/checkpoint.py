"""A chat checkpoint made here: a random Qwen2 model (transformers' save_pretrained) with a
ChatML byte-level BPE trained here, the Qwen2.5 chat template (tools in the system message,
``<tool_call>`` blocks), and the end ids of an instruct checkpoint: config.json's
``<|endoftext|>``, generation_config.json's ``[<|im_end|>, <|endoftext|>]``, the tokenizer's
``eos_token`` ``<|im_end|>``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers as hf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

TEMPLATES = Path(__file__).parent / "data" / "templates"
QWEN_TEMPLATE = TEMPLATES / "Qwen--Qwen2.5-7B-Instruct.jinja"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>"]  # added but not special, as in Qwen2.5's tokenizer
CORPUS = ['{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
          "You are a helpful assistant. Answer the user's question in a few words.",
          "The weather in Paris is sunny, 21 degrees. [1, 2.5, -3e2, true, false, null]",
          "user assistant system tool 0123456789 {}[]:,\"'- abcdefghijklmnopqrstuvwxyz",
          "ABCDEFGHIJKLMNOPQRSTUVWXYZ café naïve 日本 🙂 # Tools <tools></tools> function"] * 30
VOCAB = 512


def train_bpe(corpus: list[str], special: list[str], added: list[str], vocab: int) -> Tokenizer:
    """A byte-level BPE of ``vocab`` ids trained on ``corpus``: the ``special`` tokens first,
    then the merges, then the ``added`` (not special) tokens last."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab - len(added), special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tokenizer


def chatml_tokenizer() -> Tokenizer:
    """A byte-level BPE of 512 ids: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2, then the
    tool-call markers and the merges."""
    return train_bpe(CORPUS, SPECIAL, ADDED, VOCAB)


def write_chat_checkpoint(folder: Path, template: str | None = None, *, seed: int = 0,
                          layers: int = 2) -> Path:
    """A random Qwen2 chat checkpoint in ``folder`` (returned)."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = chatml_tokenizer()
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL}
    torch.manual_seed(seed)
    config = hf.Qwen2Config(vocab_size=tokenizer.get_vocab_size(), hidden_size=64,
                            intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                            num_key_value_heads=2, max_position_embeddings=1024,
                            bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"],
                            tie_word_embeddings=True, initializer_range=0.2)
    model = hf.Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "model_max_length": 1024}))
    text = template if template is not None else QWEN_TEMPLATE.read_text(encoding="utf-8")
    (folder / "chat_template.jinja").write_text(text, encoding="utf-8")
    return folder
