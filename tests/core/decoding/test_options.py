"""Generation options: one validated object, as keywords or a config; a bad value is a typed
error naming the option, in both runtimes, before any work; OpenAI's penalties and logit bias
give the same tokens in both runtimes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import transformer_kit as tk
from transformer_kit.core.decoding import GenerationConfig, generation_config

BAD = {
    "negative temperature": ({"do_sample": True, "temperature": -0.5}, "temperature"),
    "zero temperature": ({"do_sample": True, "temperature": 0}, "temperature"),
    "top_p 0": ({"do_sample": True, "top_p": 0}, "top_p"),
    "top_p above 1": ({"do_sample": True, "top_p": 1.5}, "top_p"),
    "num_beams 0": ({"num_beams": 0}, "num_beams"),
    "returns over beams": ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences (3)"),
    "greedy returns": ({"num_return_sequences": 2}, "num_return_sequences=2"),
    "negative max_new_tokens": ({"max_new_tokens": -1}, "max_new_tokens"),
    "fractional max_new_tokens": ({"max_new_tokens": 2.5}, "max_new_tokens"),
    "boolean max_new_tokens": ({"max_new_tokens": True}, "max_new_tokens"),
    "min above max": ({"max_new_tokens": 3, "min_new_tokens": 4}, "min_new_tokens (4)"),
    "nan penalty": ({"repetition_penalty": float("nan")}, "repetition_penalty"),
    "zero penalty": ({"repetition_penalty": 0.0}, "repetition_penalty"),
    "negative top_k": ({"do_sample": True, "top_k": -1}, "top_k"),
    "min_p above 1": ({"do_sample": True, "min_p": 2}, "min_p"),
    "negative eos": ({"eos_id": [2, -1]}, "eos_id"),
    "empty stop": ({"stop": [""]}, "stop"),
    "early_stopping word": ({"early_stopping": "sometimes"}, "early_stopping"),
    "presence_penalty 3": ({"presence_penalty": 3}, "presence_penalty"),
    "frequency_penalty -2.5": ({"frequency_penalty": -2.5}, "frequency_penalty"),
    "logit_bias 200": ({"logit_bias": {5: 200}}, "logit_bias"),
    "logit_bias string key": ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    "logit_bias negative id": ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    "logit_bias outside the vocabulary": ({"logit_bias": {40: 1.0}}, "vocabulary of 40 ids"),
    "unknown option": ({"temprature": 0.5}, "temprature"),
    "unknown processor": ({"logits_processors": ["no_such"]}, "no_such"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_options_are_typed_errors_naming_the_option(runtimes, prompts, case):
    model, onnx_model = runtimes
    options, named = BAD[case]
    for call in (lambda: model.generate(prompts, **options),
                 lambda: onnx_model.generate(prompts.numpy(), **options),
                 lambda: next(iter(model.stream(prompts, **options)))):
        with pytest.raises(tk.TransformerKitError) as error:
            call()
        assert named in str(error.value)
        assert isinstance(error.value, (tk.InputError, tk.ConfigError))


def test_a_config_and_keywords_merge_keywords_winning(runtimes, prompts):
    model, onnx_model = runtimes
    config = GenerationConfig(num_beams=3, max_new_tokens=4, length_penalty=0.5)
    merged = generation_config(config, max_new_tokens=6)
    assert (merged.num_beams, merged.max_new_tokens, merged.length_penalty) == (3, 6, 0.5)
    by_config = model.generate(prompts, generation_config=config, max_new_tokens=6).numpy()
    by_keywords = model.generate(prompts, 6, num_beams=3, length_penalty=0.5).numpy()
    np.testing.assert_array_equal(by_config, by_keywords)
    np.testing.assert_array_equal(onnx_model.generate(prompts.numpy(), generation_config=merged),
                                  by_keywords)


def test_sampling_options_without_sampling_warn():
    with pytest.warns(UserWarning, match="temperature, top_p only change sampling"):
        generation_config(temperature=0.5, top_p=0.9)


def test_stop_strings_need_a_tokenizer(runtimes, prompts):
    model, onnx_model = runtimes
    for call in (lambda: model.generate(prompts, stop=["\\n"]),
                 lambda: onnx_model.generate(prompts.numpy(), stop="END")):
        with pytest.raises(tk.InputError, match="tokenizer"):
            call()


@pytest.mark.parametrize("mask", [np.ones((3, 5), np.int64), np.full((3, 6), 2), np.ones((2, 6))])
def test_a_wrong_attention_mask_is_refused(runtimes, prompts, mask):
    model, onnx_model = runtimes
    for call in (lambda: model.generate(prompts, attention_mask=torch.from_numpy(mask)),
                 lambda: model(prompts, attention_mask=torch.from_numpy(mask)),
                 lambda: onnx_model.generate(prompts.numpy(), attention_mask=mask),
                 lambda: onnx_model(prompts.numpy(), attention_mask=mask)):
        with pytest.raises(tk.InputError, match="attention_mask"):
            call()


def test_beam_search_cannot_stream(runtimes, prompts):
    model, onnx_model = runtimes
    with pytest.raises(tk.InputError, match="beam search"):
        next(iter(model.stream(prompts, num_beams=2)))
    with pytest.raises(tk.InputError, match="beam search"):
        onnx_model.stream(prompts.numpy(), num_beams=2)


@pytest.mark.parametrize("options", [
    {"presence_penalty": 1.5, "frequency_penalty": 0.8},
    {"logit_bias": {7: 4.0, 11: -100.0}, "frequency_penalty": -0.5},
    {"do_sample": True, "seed": 4, "presence_penalty": 2.0, "logit_bias": {9: 3.0}},
])
def test_penalties_and_a_logit_bias_take_effect_alike_in_both_runtimes(runtimes, prompts, options):
    model, onnx_model = runtimes
    ours = model.generate(prompts, 12, **options).numpy()
    np.testing.assert_array_equal(onnx_model.generate(prompts.numpy(), 12, **options), ours)
    plain = {k: v for k, v in options.items() if k in ("do_sample", "seed")}
    assert (ours != model.generate(prompts, 12, **plain).numpy()).any()  # they changed the tokens
    if 11 in options.get("logit_bias", {}):
        assert 11 not in ours
