"""Reasoning checkpoints made here: a random Qwen3 (transformers' save_pretrained) with a byte-level
BPE trained here, and either Qwen3's real chat template (``<think>``) or gpt-oss's (harmony
channels, with gpt-oss's special tokens).

A random model writes random text, which would never hold the markup. So the weights are set
to write a chosen reply: every layer's output projections are zero (each layer adds nothing),
so the last hidden state is the last token's embedding, and the head's row of each chosen next
token is the (normalized) embedding of the token before it: greedy decoding follows the chain
``token -> next`` wherever a chain token comes last (a bigram model, exact in float32).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import torch
import transformers as hf
from tokenizers import Tokenizer

from tests.chat.checkpoint import train_bpe

TEMPLATES = Path(__file__).parent / "data" / "templates"
QWEN3_TEMPLATE = TEMPLATES / "Qwen--Qwen3-0.6B.jinja"
GPT_OSS_TEMPLATE = TEMPLATES / "openai--gpt-oss-120b.jinja"
CORPUS = ['{"city": "Paris"} get_weather functions commentary analysis final json assistant',
          "The user asks about the weather in Paris. It is sunny, 21 degrees.",
          "user system developer tool 0123456789 {}[]:,\"'- abcdefghijklmnopqrstuvwxyz to=",
          "Reasoning: low medium high # Tools # Valid channels Knowledge cutoff Current date",
          "assistant", "analysis", "commentary", "functions.get_weather", "The", "user", "\n\n"] * 30
QWEN3 = {"special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
         "added": ["<think>", "</think>", "<tool_call>", "</tool_call>"],  # not special, as Qwen3's
         "eos_token": "<|im_end|>", "ends": ["<|im_end|>", "<|endoftext|>"]}
HARMONY = {"special": ["<|endoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                       "<|constrain|>", "<|return|>", "<|call|>"],
           "added": [], "eos_token": "<|return|>", "ends": ["<|return|>", "<|call|>", "<|endoftext|>"]}


def train_tokenizer(special: list[str], added: list[str], vocab: int = 640) -> Tokenizer:
    return train_bpe(CORPUS, special, added, vocab)


def chain_ids(tokenizer: Tokenizer, parts: list[str]) -> list[int]:
    """The ids of ``parts`` in order: a special or added token's id, else the text's tokens."""
    ids = []
    for part in parts:
        single = tokenizer.token_to_id(part)
        ids += [single] if single is not None else tokenizer.encode(part, add_special_tokens=False).ids
    return ids


def write_reasoning_checkpoint(folder: Path, kind: str, chains: list[list[str]]) -> Path:
    """A Qwen3 checkpoint in ``folder`` (returned) whose greedy reply follows the chain (texts
    and tokens) that starts with the prompt's last token. ``kind``: "qwen3" (Qwen3's template)
    or "harmony" (gpt-oss's template and special tokens)."""
    spec = QWEN3 if kind == "qwen3" else HARMONY
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec["special"], spec["added"])
    pairs: dict[int, int] = {}
    for chain in chains:
        ids = chain_ids(tokenizer, chain)
        for token, following in itertools.pairwise(ids):
            assert pairs.setdefault(token, following) == following, f"{token} has two next tokens"
    end_ids = [tokenizer.token_to_id(t) for t in spec["ends"]]
    torch.manual_seed(0)
    config = hf.Qwen3Config(vocab_size=tokenizer.get_vocab_size(), hidden_size=64,
                            intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                            bos_token_id=end_ids[-1], eos_token_id=end_ids[-1],
                            tie_word_embeddings=False, initializer_range=0.2)
    model = hf.Qwen3ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        model.lm_head.weight.zero_()
        for token, following in pairs.items():
            model.lm_head.weight[following] += embed[token] / embed[token].norm()
    model.generation_config.eos_token_id = end_ids
    model.generation_config.pad_token_id = end_ids[-1]
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": spec["eos_token"],
        "pad_token": "<|endoftext|>", "model_max_length": 2048}))
    template = QWEN3_TEMPLATE if kind == "qwen3" else GPT_OSS_TEMPLATE
    (folder / "chat_template.jinja").write_text(template.read_text(encoding="utf-8"), encoding="utf-8")
    return folder
