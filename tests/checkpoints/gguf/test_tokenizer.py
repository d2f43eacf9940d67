"""The tokenizer rebuilt from a GGUF file's metadata equals transformers' rebuilding of it
(``AutoTokenizer.from_pretrained(folder, gguf_file=...)``): here Llama's sentencepiece kind, BPE
with byte fallback and merges recovered from the scores (the byte-level kind: test_smollm2.py)."""

from __future__ import annotations

import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.checkpoints.gguf.writer import sentencepiece_vocabulary, write_gguf
from transformer_kit.checkpoints.gguf.tokenizer import merges_from_scores

TEXTS = ["hi abc", " a  b", "abc\nhi", "é and 🙂 by bytes", "<s>ab</s>"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spm")
    tokens = sentencepiece_vocabulary()[0]
    torch.manual_seed(0)
    model = hf.LlamaForCausalLM(hf.LlamaConfig(
        vocab_size=len(tokens), hidden_size=32, intermediate_size=48, num_attention_heads=2,
        num_key_value_heads=1, num_hidden_layers=1, max_position_embeddings=32,
        bos_token_id=1, eos_token_id=2))
    write_gguf(model, folder / "model.gguf", "llama")
    return folder


def test_sentencepiece_ids_and_text_equal_transformers(folder):
    reference = hf.AutoTokenizer.from_pretrained(folder, gguf_file="model.gguf")
    ours = tk.from_gguf(folder / "model.gguf", pad_id=0).tokenizer
    for text in TEXTS:
        ids, _ = ours.encode([text])
        assert ids[0].tolist() == reference(text).input_ids, text
        assert ours.decode(ids[0]) == reference.decode(ids[0], skip_special_tokens=True), text
    assert ours.encode(["hi"])[0][0].tolist()[0] == 1  # BOS added: the file does not say otherwise


def test_merges_are_transformers_merges_recovered_from_the_scores():
    from transformers.tokenization_utils_base import generate_merges

    tokens, scores, _ = sentencepiece_vocabulary()
    expected = generate_merges({t: i for i, t in enumerate(tokens)}, dict(zip(tokens, scores, strict=True)))
    merges = merges_from_scores(tokens, scores)
    assert merges == [list(m) for m in expected]
    assert merges[:3] == [["\u2581", "a"], ["a", "b"], ["\u2581a", "b"]]  # best score, longer left first
