"""transformer-kit generate: the tokens and text of OnnxModel.generate, with every option."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.apps.conftest import cli, invoke
from transformer_kit.runtime import OnnxModel


def test_generate_gives_pytorch_s_tokens(exported):
    model, folder = exported
    result = invoke("generate", str(folder / "onnx"), "--ids", "5 6 7; 8 9", "--max-new-tokens", "5")
    assert result.exit_code == 0, result.output
    tokens = model.generate(torch.tensor([[5, 6, 7], [8, 9, 0]]), max_new_tokens=5).tolist()
    for row in tokens:
        assert " ".join(map(str, row)) in result.output


@pytest.mark.parametrize("options", [
    {"do_sample": True, "temperature": 0.7, "top_k": 9, "seed": 4},
    {"num_beams": 3, "length_penalty": 0.5, "num_return_sequences": 2},
    {"repetition_penalty": 1.4, "no_repeat_ngram_size": 2, "eos_id": [7, 9]},
])
def test_options_reach_the_decoder(exported, options):
    _, folder = exported
    flags = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        values = value if isinstance(value, list) else [value]
        flags += [flag] if value is True else [x for v in values for x in (flag, str(v))]
    result = invoke("generate", str(folder / "onnx"), "--ids", "5 6 7; 8 9", "--max-new-tokens",
                    "6", *flags)
    assert result.exit_code == 0, result.output
    om = OnnxModel(folder / "onnx", providers="cpu")
    expected = om.generate(np.array([[5, 6, 7], [8, 9, 0]]), 6,
                           attention_mask=np.array([[1, 1, 1], [1, 1, 0]]), **options)
    for row in expected.tolist():
        assert " ".join(map(str, row)) in result.output


def test_prompt_lookup_gives_plain_greedys_tokens(exported):
    _, folder = exported
    ids = "5 6 7 5 6 7 5 6"
    result = invoke("generate", str(folder / "onnx"), "--ids", ids, "--max-new-tokens", "8",
                    "--prompt-lookup-num-tokens", "4")
    assert result.exit_code == 0, result.output
    om = OnnxModel(folder / "onnx", providers="cpu")
    expected = om.generate(np.array([[int(i) for i in ids.split()]]), 8)
    assert " ".join(map(str, expected[0].tolist())) in result.output


def test_bad_options_are_one_line_errors(exported):
    _, folder = exported
    cases = {("--do-sample", "--temperature", "-1"): "temperature=-1.0",
             ("--num-beams", "0"): "num_beams=0",
             ("--top-p", "0", "--do-sample"): "top_p=0.0",
             ("--max-new-tokens", "-1"): "max_new_tokens=-1",
             ("--prompt", "hello"): "has no tokenizer"}
    for flags, named in cases.items():
        ids = [] if "--prompt" in flags else ["--ids", "5 6"]
        result = invoke("generate", str(folder / "onnx"), *ids, *flags)
        assert result.exit_code == 1, result.output
        assert named in result.output and "Traceback" not in result.output
    both = invoke("generate", str(folder / "onnx"))
    assert both.exit_code == 2 and "--ids / --prompt" in both.output


def test_a_text_prompt_streams_the_text(text_export):
    om = OnnxModel(text_export, providers="cpu")
    result = invoke("generate", str(text_export), "--prompt", "the quick", "--max-new-tokens", "12",
                    "--eos-id", "299")
    assert result.exit_code == 0, result.output
    assert om.generate("the quick", 12, eos_id=[299]) + "\n" in result.output
    assert "12 tokens in" in result.output
    batch = invoke("generate", str(text_export), "--prompt", "the", "--prompt", "über café",
                   "--max-new-tokens", "8")
    assert batch.exit_code == 0, batch.output
    for text in om.generate(["the", "über café"], 8):
        assert text in batch.output


def test_generate_in_a_real_process(tmp_path, exported):
    _, folder = exported
    result = cli("generate", str(folder / "onnx"), "--ids", "5 6 7", "--max-new-tokens", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "tokens/s" in result.stdout
