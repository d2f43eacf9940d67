"""OneShotGeneration: the rows and the streamed row of a generation on an OnnxModel are
transformers' greedy (or beam) tokens on the same random GPT-2, their text the tokenizer's
decoding of them (cut before a stop string, where the row ends), and the token count each row's
tokens up to its eos; sampling gives OnnxModel.generate's tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_kit.core.errors import InputError
from transformer_kit.runtime import OneShotGeneration

EOS = 2
PROMPTS = ["the quick", "über café 🙂"]


def transformers_rows(hf_model, rows: list[list[int]], max_new_tokens: int, eos: int = EOS,
                      **options) -> list[list[int]]:
    """transformers' new tokens for each prompt alone (no padding), each up to its ``eos``
    (included); several per prompt with ``num_return_sequences``."""
    out = []
    for row in rows:
        with torch.no_grad():
            tokens = hf_model.generate(torch.tensor([row]), max_new_tokens=max_new_tokens,
                                       eos_token_id=eos, pad_token_id=0, **options)
        out += up_to_eos(tokens[:, len(row):].numpy(), eos)
    return out


def up_to_eos(tokens: np.ndarray, eos: int = EOS) -> list[list[int]]:
    """Each row's tokens (rows, steps) up to its ``eos`` (included): the rest is padding."""
    return [row[:row.index(eos) + 1] if eos in row else row for row in tokens.tolist()]


def texts_of(hf_tokenizer, rows: list[list[int]], eos: int = EOS) -> list[str]:
    """Each row's text: its tokens before the eos, decoded by transformers' tokenizer."""
    return [hf_tokenizer.decode([t for t in row if t != eos], skip_special_tokens=True) for row in rows]


def encoded(hf_tokenizer, prompts: list[str]) -> list[list[int]]:
    return [hf_tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]


def test_text_rows_are_transformers_greedy_rows(gpt2_text):
    hf_model, om, hf_tokenizer = gpt2_text
    run = OneShotGeneration(om, PROMPTS, max_new_tokens=12)
    assert run.is_text and run.rows == 2 and not run.streams
    rows = run.generate()
    expected = transformers_rows(hf_model, encoded(hf_tokenizer, PROMPTS), 12)
    assert up_to_eos(rows.tokens) == expected
    assert rows.texts == texts_of(hf_tokenizer, expected) == om.generate(PROMPTS, 12)
    assert rows.token_count == sum(map(len, expected))


def test_a_row_ends_at_its_eos_id_which_counts(gpt2_text):
    hf_model, om, hf_tokenizer = gpt2_text
    prompts = encoded(hf_tokenizer, PROMPTS)
    eos = transformers_rows(hf_model, prompts, 12)[0][3]  # the first row's fourth token
    expected = transformers_rows(hf_model, prompts, 12, eos=eos)
    assert expected[0][-1] == eos and len(expected[0]) < 12
    rows = OneShotGeneration(om, PROMPTS, max_new_tokens=12, eos_id=[eos]).generate()
    assert up_to_eos(rows.tokens, eos) == expected
    assert rows.texts == texts_of(hf_tokenizer, expected, eos)
    assert rows.token_count == sum(map(len, expected))
    stream = OneShotGeneration(om, PROMPTS[:1], max_new_tokens=12, eos_id=[eos]).stream()
    assert "".join(d.text for d in stream) + stream.rest() == rows.texts[0]
    assert stream.tokens == expected[0]


def test_one_row_streams_the_same_text_and_tokens(gpt2_text):
    hf_model, om, hf_tokenizer = gpt2_text
    run = OneShotGeneration(om, PROMPTS[1:], max_new_tokens=16)
    assert run.streams
    stream = run.stream()
    deltas = list(stream)
    text = "".join(d.text for d in deltas) + stream.rest()
    [expected] = transformers_rows(hf_model, encoded(hf_tokenizer, PROMPTS[1:]), 16)
    assert [d.token_id for d in deltas] == stream.tokens == expected
    assert text == texts_of(hf_tokenizer, [expected])[0] == om.generate(PROMPTS[1], 16)


def test_a_stop_string_cuts_the_text_and_ends_the_row(gpt2_text):
    hf_model, om, hf_tokenizer = gpt2_text
    [tokens] = transformers_rows(hf_model, encoded(hf_tokenizer, PROMPTS[:1]), 24)
    full = hf_tokenizer.decode(tokens, skip_special_tokens=True)
    assert len(full) > 8, full
    stop = full[len(full) // 2:len(full) // 2 + 3]
    # the row ends at the token whose text completes the stop string's first appearance
    ends = next(k for k in range(1, len(tokens) + 1) if stop in hf_tokenizer.decode(tokens[:k]))
    expected = full[:full.index(stop)]
    stream = OneShotGeneration(om, PROMPTS[:1], max_new_tokens=24, stop=[stop]).stream()
    assert "".join(d.text for d in stream) + stream.rest() == expected
    assert stream.tokens == tokens[:ends]
    rows = OneShotGeneration(om, [PROMPTS[0], PROMPTS[0]], max_new_tokens=24, stop=[stop]).generate()
    assert rows.texts == [expected, expected] == om.generate([PROMPTS[0]] * 2, 24, stop=[stop])
    assert rows.token_count == 2 * ends


def test_id_prompts_give_tokens_and_no_text(gpt2_text):
    hf_model, om, _ = gpt2_text
    ids, mask = np.array([[5, 6, 7], [8, 9, 0]]), np.array([[1, 1, 1], [1, 1, 0]])
    rows = OneShotGeneration(om, ids, attention_mask=mask, max_new_tokens=8).generate()
    expected = transformers_rows(hf_model, [[5, 6, 7], [8, 9]], 8)
    assert rows.texts is None and up_to_eos(rows.tokens) == expected
    stream = OneShotGeneration(om, ids[1:, :2], max_new_tokens=8).stream()
    assert {d.text for d in stream} == {""} and stream.rest() == ""
    assert stream.tokens == expected[1]


def test_beams_and_several_sequences_per_prompt(gpt2_text):
    hf_model, om, hf_tokenizer = gpt2_text
    options = {"num_beams": 3, "num_return_sequences": 2, "length_penalty": 0.5}
    run = OneShotGeneration(om, PROMPTS, max_new_tokens=6, **options)
    assert run.rows == 4 and not run.streams
    rows = run.generate()
    expected = transformers_rows(hf_model, encoded(hf_tokenizer, PROMPTS), 6, do_sample=False,
                                 early_stopping=True, **options)
    assert up_to_eos(rows.tokens) == expected
    assert rows.texts == texts_of(hf_tokenizer, expected) == om.generate(PROMPTS, 6, **options)
    with pytest.raises(InputError, match="one row"):
        run.stream()
    with pytest.raises(InputError, match="beam search"):
        OneShotGeneration(om, PROMPTS[:1], max_new_tokens=6, num_beams=2).stream()


@pytest.mark.parametrize("options", [
    {"do_sample": True, "temperature": 0.7, "top_k": 9, "seed": 4},
    {"repetition_penalty": 1.4, "no_repeat_ngram_size": 2, "eos_id": [7, 9]},
])
def test_the_options_reach_the_decoder(gpt2_text, options):
    _, om, _ = gpt2_text
    rows = OneShotGeneration(om, PROMPTS, max_new_tokens=10, **options).generate()
    assert rows.texts == om.generate(PROMPTS, 10, **options)
    stream = OneShotGeneration(om, PROMPTS[:1], max_new_tokens=10, **options).stream()
    assert "".join(d.text for d in stream) + stream.rest() == om.generate(PROMPTS[0], 10, **options)


def test_what_cannot_run_is_refused_before_anything_runs(gpt2_text, monkeypatch):
    _, om, _ = gpt2_text
    with pytest.raises(InputError, match="temperature"):
        OneShotGeneration(om, PROMPTS, do_sample=True, temperature=-1.0)
    monkeypatch.setattr(om, "tokenizer", None)
    with pytest.raises(InputError, match="has no tokenizer"):
        OneShotGeneration(om, PROMPTS)
