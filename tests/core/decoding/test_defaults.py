"""A checkpoint's own sampling defaults (its generation_config.json): read by from_hf, kept by
save and export, and used by ``generate``/``chat`` (PyTorch and onnxruntime), ``transformer-kit
chat`` and the server where a call sets nothing; a call's temperature 0 is greedy, and
``use_generation_defaults=False`` / ``--generation-config ignore`` leave them out."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
import transformers as hf

import transformer_kit as tk
from tests.apps.conftest import invoke
from tests.chat.checkpoint import write_chat_checkpoint
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.core.decoding.defaults import read_defaults, with_defaults
from transformer_kit.export import export_onnx
from transformer_kit.runtime import Engine, OnnxModel

#: A sampling checkpoint's generation_config.json values (Qwen3's kind: temperature, top_p, top_k).
SAMPLES = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
           "repetition_penalty": 1.3}
EXPLICIT = {k: v for k, v in SAMPLES.items()}
MESSAGES = [{"role": "user", "content": "Tell me about café culture."}]


@pytest.fixture(scope="module")
def sampling_checkpoint(tmp_path_factory):
    """(folder, the kit's model, its export) of a random chat checkpoint whose
    generation_config.json samples."""
    folder = write_chat_checkpoint(tmp_path_factory.mktemp("sampling") / "qwen2", seed=3)
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **SAMPLES}))
    model = tk.from_hf(folder)
    export_onnx(model, folder / "onnx")
    return folder, model, OnnxModel(folder / "onnx", providers="cpu")


def test_from_hf_reads_the_defaults_and_save_and_export_keep_them(sampling_checkpoint, tmp_path):
    _, model, om = sampling_checkpoint
    assert model.generation_defaults == SAMPLES
    assert om.generation_defaults == SAMPLES
    model.save(tmp_path / "saved")
    assert tk.load_model(tmp_path / "saved").generation_defaults == SAMPLES


def test_unusable_values_are_left_out_as_transformers_leaves_them_unset():
    assert read_defaults({"do_sample": True, "temperature": None, "top_k": 0, "top_p": 1.5,
                          "min_p": 0.1, "repetition_penalty": "high"}) == {"do_sample": True, "min_p": 0.1}


def test_the_rules_of_a_call_over_the_defaults():
    assert with_defaults(SAMPLES, {"temperature": 0}) == {"do_sample": False, "repetition_penalty": 1.3}
    assert with_defaults(SAMPLES, {"top_p": 0.5}) == {**SAMPLES, "top_p": 0.5}
    assert with_defaults(SAMPLES, {"use_generation_defaults": False, "seed": 1}) == {"seed": 1}
    # without do_sample in the file, transformers' generate is greedy: the sampling values go
    assert with_defaults({"temperature": 0.6, "repetition_penalty": 1.1}, {}) == {"repetition_penalty": 1.1}


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_chat_samples_with_the_checkpoints_values_unless_the_call_sets_them(sampling_checkpoint, runtime):
    _, model, om = sampling_checkpoint
    runner = model if runtime == "torch" else om
    by_default = runner.chat(MESSAGES, max_new_tokens=24, seed=5)["content"]
    assert by_default == runner.chat(MESSAGES, max_new_tokens=24, seed=5, use_generation_defaults=False,
                                     **EXPLICIT)["content"]
    plain = runner.chat(MESSAGES, max_new_tokens=24, seed=5, do_sample=True, use_generation_defaults=False)
    assert plain["content"] != by_default  # temperature 1, no top_k/top_p/min_p, no penalty: other text
    greedy = runner.chat(MESSAGES, max_new_tokens=24, temperature=0)["content"]
    assert greedy == runner.chat(MESSAGES, max_new_tokens=24, use_generation_defaults=False,
                                 repetition_penalty=1.3)["content"]
    assert runner.chat(MESSAGES, max_new_tokens=24, seed=6)["content"] != by_default  # it samples


def test_greedy_with_the_checkpoints_penalty_equals_transformers(sampling_checkpoint):
    """transformers' generate with the same generation_config.json, do_sample=False: greedy with
    the file's repetition_penalty, as the kit's temperature 0."""
    folder, _, om = sampling_checkpoint
    tokenizer = hf.AutoTokenizer.from_pretrained(folder)
    reference = hf.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert reference.generation_config.repetition_penalty == 1.3
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = om.tokenizer.encode([prompt], add_special_tokens=False)[0]
    with torch.no_grad():
        out = reference.generate(torch.from_numpy(ids), max_new_tokens=16, do_sample=False)
    expected = out[0, ids.shape[1]:].tolist()
    got = om.generate(ids, max_new_tokens=16, temperature=0)[0].tolist()
    ends = reference.generation_config.eos_token_id
    cut = next((i for i, t in enumerate(expected) if t in ends), len(expected))
    assert got[:cut] == expected[:cut]


def test_the_command_line_chat_samples_with_them_and_says_so(sampling_checkpoint):
    folder, _, om = sampling_checkpoint
    result = invoke("chat", str(folder / "onnx"), "--message", "Hello there", "--seed", "5",
                    "--max-new-tokens", "16", "--provider", "cpu")
    assert result.exit_code == 0, result.output
    expected = om.chat([{"role": "user", "content": "Hello there"}], max_new_tokens=16, seed=5,
                       use_generation_defaults=False, **EXPLICIT)["content"]
    assert result.stdout == expected + "\n"
    assert ("sampling: sampling, temperature 0.7, top_p 0.9, top_k 20, min_p 0.05, "
            "repetition_penalty 1.3") in result.stderr
    greedy = invoke("chat", str(folder / "onnx"), "--message", "Hello there", "--temperature", "0",
                    "--max-new-tokens", "16", "--provider", "cpu")
    assert greedy.exit_code == 0, greedy.output
    assert greedy.stdout == om.chat([{"role": "user", "content": "Hello there"}], max_new_tokens=16,
                                    temperature=0)["content"] + "\n"
    assert "sampling: greedy, repetition_penalty 1.3" in greedy.stderr
    ignored = invoke("chat", str(folder / "onnx"), "--message", "Hello there", "--generation-config",
                     "ignore", "--max-new-tokens", "16", "--provider", "cpu")
    assert ignored.exit_code == 0 and "sampling: greedy (--generation-config ignore)" in ignored.stderr


def test_the_server_samples_with_them_unless_the_request_sets_them(sampling_checkpoint):
    _, _, om = sampling_checkpoint
    engine = Engine(om, max_batch=4)
    with running(create_app(engine, "chat")) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
        models = httpx.get(f"{url}/v1/models").json()
        assert models["data"][0]["generation_defaults"] == SAMPLES

        def reply(**fields) -> str:
            return client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=16,
                                                  **fields).choices[0].message.content

        by_default = reply(seed=5)
        expected = om.chat(MESSAGES, max_new_tokens=16, seed=5, use_generation_defaults=False,
                           **EXPLICIT)["content"]
        assert by_default == expected
        assert reply(seed=5, temperature=0.7, top_p=0.9) == expected
        assert reply(temperature=0) == om.chat(MESSAGES, max_new_tokens=16, temperature=0)["content"]
        assert reply(seed=5, temperature=1.0) == om.chat(MESSAGES, max_new_tokens=16, seed=5,
                                                         **{**EXPLICIT, "temperature": 1.0})["content"]
        # the Responses API reports the sampling in effect: the checkpoint's, the request's, greedy
        said = [client.responses.create(model="chat", input="Hi", max_output_tokens=2, **fields)
                for fields in ({}, {"temperature": 1.2, "top_p": 0.5}, {"temperature": 0})]
        assert [(r.temperature, r.top_p) for r in said] == [(0.7, 0.9), (1.2, 0.5), (0.0, 1.0)]
    engine.close()
    ignoring = Engine(om, max_batch=4)
    with running(create_app(ignoring, "chat", generation_config="ignore")) as url:
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["generation_defaults"] == {}
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)
        got = client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=16, seed=5)
        assert got.choices[0].message.content == om.chat(
            MESSAGES, max_new_tokens=16, seed=5, do_sample=True, use_generation_defaults=False)["content"]
    ignoring.close()
