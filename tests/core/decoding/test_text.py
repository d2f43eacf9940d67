"""Text in, text out: a checkpoint's tokenizer.json travels with the model (from_hf, save,
export), strings generate strings in both runtimes, streamed pieces join to the text and
never split a character, and stop strings end rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as hf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import transformer_kit as tk
from transformer_kit.core.decoding.text import TextPieces
from transformer_kit.export import export_onnx
from transformer_kit.runtime import OnnxModel
from transformer_kit.tokenizer import TextTokenizer

VOCAB = 300
CORPUS = ["héllo wörld, the quick brown fox", "日本語のテキスト 🙂 and more words",
          "über naïve café 🙂🙂", "the end of the text"] * 20
MULTIBYTE = "naïve 日本語 🙂!"


def byte_level_tokenizer() -> Tokenizer:
    """A byte-level BPE of 300 tokens (<pad>, <s>, </s> = 0, 1, 2), trained here."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


@pytest.fixture(scope="module")
def text_runtimes(tmp_path_factory):
    """(PyTorch model from a GPT-2 checkpoint with tokenizer.json, OnnxModel of its export)."""
    folder = tmp_path_factory.mktemp("gpt2-text")
    torch.manual_seed(0)
    hf.GPT2LMHeadModel(hf.GPT2Config(vocab_size=VOCAB, n_positions=96, n_embd=32, n_head=4,
                                     n_layer=2, bos_token_id=1, eos_token_id=2,
                                     initializer_range=0.2)).save_pretrained(folder)
    byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 96}))
    model = tk.from_hf(folder)
    export_onnx(model, folder / "onnx")
    return model, OnnxModel(folder / "onnx", providers="cpu")


def test_the_tokenizer_travels_with_the_model(text_runtimes, tmp_path):
    model, onnx_model = text_runtimes
    assert model.tokenizer is not None and onnx_model.tokenizer is not None
    assert onnx_model.manifest.tokenizer == ["tokenizer.json", "tokenizer_config.json"]
    assert onnx_model.tokenizer.files == model.tokenizer.files
    model.save(tmp_path / "saved")
    assert tk.load_model(tmp_path / "saved").tokenizer.files == model.tokenizer.files


def test_strings_generate_strings_in_both_runtimes(text_runtimes):
    model, onnx_model = text_runtimes
    prompts = ["the quick brown", "über", "日本語 🙂 and"]
    texts = model.generate(prompts, 20, eos_id=[])
    assert isinstance(texts, list) and len(texts) == 3
    assert onnx_model.generate(prompts, 20, eos_id=[]) == texts
    reference = Tokenizer.from_file(str(onnx_model.path / "tokenizer.json"))
    for prompt, text in zip(prompts, texts, strict=True):  # batched = alone (padding handled)
        ids = torch.tensor([reference.encode(prompt).ids])
        alone = model.generate(ids, 20, eos_id=[])[0].tolist()
        assert text == reference.decode(alone, skip_special_tokens=True)
        assert model.generate(prompt, 20, eos_id=[]) == text  # one string in, one string out
    sampled = onnx_model.generate("the", 12, do_sample=True, seed=3, num_return_sequences=2)
    assert sampled == model.generate("the", 12, do_sample=True, seed=3, num_return_sequences=2)


def test_streamed_pieces_join_to_the_text(text_runtimes):
    model, onnx_model = text_runtimes
    for runtime in (model, onnx_model):
        pieces = list(runtime.stream("naïve 日本", 24, eos_id=[]))
        assert all(isinstance(p, str) for p in pieces)
        assert "".join(pieces) == runtime.generate("naïve 日本", 24, eos_id=[])
        batch = list(runtime.stream(["the", "über café"], 16, eos_id=[]))
        joined = ["".join(step[row] for step in batch) for row in range(2)]
        assert joined == runtime.generate(["the", "über café"], 16, eos_id=[])


def test_incremental_decoding_never_splits_a_character(text_runtimes):
    model, _ = text_runtimes
    tokens = model.tokenizer.backend.encode(MULTIBYTE).ids
    alone = [model.tokenizer.decode([t]) for t in tokens]
    assert any("\ufffd" in piece for piece in alone)  # some tokens hold part of a character
    stream = TextPieces(model.tokenizer, eos_ids=[2], stops=[])
    pieces = [stream.add(t) for t in tokens] + [stream.add(2)]
    assert not any("\ufffd" in piece for piece in pieces)
    assert "".join(pieces) == MULTIBYTE


def test_stop_strings_end_rows_at_the_right_token(text_runtimes):
    model, onnx_model = text_runtimes
    full = model.generate("the quick", 40, eos_id=[])
    ids = torch.tensor([model.tokenizer.backend.encode("the quick").ids])
    full_tokens = model.generate(ids, 40, eos_id=[])[0].tolist()
    start = next(i for i in range(4, len(full) - 3)
                 if "\ufffd" not in full[i:i + 3] and full.find(full[i:i + 3]) == i)
    stop = full[start:start + 3]
    for runtime in (model, onnx_model):
        assert runtime.generate("the quick", 40, eos_id=[], stop=[stop, "\x00never"]) == full[:start]
        assert "".join(runtime.stream("the quick", 40, eos_id=[], stop=stop)) == full[:start]
    matcher = model.tokenizer.stop_matcher([stop])
    ends = [n for n in range(1, len(full_tokens) + 1) if matcher(np.array([full_tokens[:n]]))[0]]
    text_before = model.tokenizer.decode(full_tokens[:ends[0] - 1])
    assert stop not in text_before and stop in model.tokenizer.decode(full_tokens[:ends[0]])


def test_text_without_a_tokenizer_is_one_sentence(runtimes):
    model, onnx_model = runtimes
    for call in (lambda: model.generate("hello"), lambda: onnx_model.generate(["a", "b"]),
                 lambda: onnx_model.stream("hello")):
        with pytest.raises(tk.InputError, match=r"has no tokenizer .* takes token ids, not text"):
            call()


def test_a_damaged_tokenizer_file_is_a_checkpoint_error():
    with pytest.raises(tk.CheckpointError, match=r"tokenizer\.json cannot be read"):
        TextTokenizer({"tokenizer.json": b"{not json"})


def _pieces(tokenizer, tokens: list[int], **options) -> str:
    stream = TextPieces(tokenizer, options.pop("eos_ids", [2]), **options)
    return "".join(stream.add(t) for t in tokens) + stream.finish()


def test_pieces_keep_the_stop_count_it_from_min_tokens_and_write_special_tokens(text_runtimes):
    """vLLM's include_stop_str_in_output, min_tokens (a stop string counts where it ends in
    the text of that token or later) and skip_special_tokens=False, on a served reply's text."""
    tokenizer = text_runtimes[0].tokenizer
    text = "the end of the text, the end"
    tokens = tokenizer.backend.encode(text).ids
    assert _pieces(tokenizer, tokens, stops=["end"]) == "the "
    assert _pieces(tokenizer, tokens, stops=["end"], keep_stop=True) == "the end"
    assert _pieces(tokenizer, tokens, stops=["end", "the e"], keep_stop=True) == "the e"  # completed first
    first = next(n for n in range(1, len(tokens)) if "end" in tokenizer.decode(tokens[:n]))
    later = _pieces(tokenizer, tokens, stops=["end"], min_tokens=first + 1)
    assert later == text[:text.rindex("end")]  # the first "end" came before token min_tokens
    assert _pieces(tokenizer, tokens, stops=["end"], min_tokens=first) == "the "  # it ends in that one
    assert _pieces(tokenizer, [*tokens, 2, 5], stops=[]) == text  # the end id ends the text
    assert _pieces(tokenizer, [*tokens, 2, 5], stops=[], keep_stop=True) == text  # skipped: special
    written = _pieces(tokenizer, [*tokens, 2], stops=[], keep_stop=True, skip_special_tokens=False)
    assert written == text + "</s>"
    assert _pieces(tokenizer, [1, *tokens, 2], eos_ids=[], stops=[], skip_special_tokens=False) == (
        f"<s>{text}</s>")


def test_a_stop_string_held_open_by_min_new_tokens_does_not_end_the_row_later(text_runtimes):
    """The stop matcher ends a row where its last token completed a stop string, not at the
    first token past min_new_tokens while one it held open is still in the window."""
    tokenizer = text_runtimes[0].tokenizer
    tokens = tokenizer.backend.encode("the end of the text, the end").ids
    matcher = tokenizer.stop_matcher(["end"])
    ends = [n for n in range(1, len(tokens) + 1) if matcher(np.array([tokens[:n]]))[0]]
    assert len(ends) == 2 and "end" not in tokenizer.decode(tokens[:ends[0] - 1])
    assert tokenizer.decode(tokens[:ends[1]]).count("end") == 2
