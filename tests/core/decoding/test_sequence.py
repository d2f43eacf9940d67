"""One sequence's search, run by a caller that makes the logits itself (here: the PyTorch
model's full forward over the sequence so far, no cache) gives the tokens ``generate`` gives,
and says why it ended."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.core.decoding.conftest import VOCAB
from transformer_kit.core.decoding import SequenceSearch, generation_config
from transformer_kit.core.decoding.prompts import prepare_call


def _search(model, prompt: list[int], stop_matcher=None, **options) -> tuple[list[int], str]:
    opts = generation_config(None, **options)
    ids = np.array([prompt], np.int64)
    call, pipeline, _ = prepare_call(ids, None, opts, decoder=True, pad_id=0, eos_id=2, bos_id=1,
                                vocab=VOCAB, context_length=64, stop_matcher=stop_matcher)
    search, sequence = SequenceSearch(call, opts, pipeline), list(prompt)
    while True:
        with torch.no_grad():  # every id real, the pad id too when the model chose it
            ids = torch.tensor([sequence])
            logits = model(ids, attention_mask=torch.ones_like(ids))[0, -1].numpy()
        token, reason = search.choose(logits)
        sequence.append(token)
        if reason is not None:
            return sequence[len(prompt):], reason


@pytest.mark.parametrize("options", [
    {},
    {"do_sample": True, "temperature": 0.8, "top_p": 0.9, "seed": 5},
    {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
    {"do_sample": True, "top_k": 5, "seed": 1, "min_new_tokens": 6},
])
def test_one_sequence_gets_the_tokens_of_generate(runtimes, options):
    model, _ = runtimes
    for prompt in ([5, 9, 14], [7], [3, 3, 20, 31, 8]):
        tokens, reason = _search(model, prompt, max_new_tokens=12, **options)
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=12, **options)[0].tolist()
        assert tokens == expected[:len(tokens)]
        if reason == "length":
            assert len(tokens) == 12 and 2 not in tokens
        else:  # ended at eos: generate fills the rest with the fill id
            assert reason == "stop" and tokens[-1] == 2 and 2 not in tokens[:-1]


def test_a_stop_string_ends_the_sequence_after_min_new_tokens(runtimes):
    model, _ = runtimes

    def third_token(new: np.ndarray) -> np.ndarray:
        return np.full(len(new), new.shape[1] >= 3)

    tokens, reason = _search(model, [5, 9], stop_matcher=third_token, max_new_tokens=10)
    assert (len(tokens), reason) == (3, "stop")
    tokens, reason = _search(model, [5, 9], stop_matcher=third_token, max_new_tokens=10,
                             min_new_tokens=5)
    assert (len(tokens), reason) == (5, "stop")
