"""LoRA adapters served beside their base: each adapter exported apart is the model
``BASE:NAME`` in /v1/models (its ``root`` its file, its ``parent`` the base, as vLLM lists a LoRA),
a request's ``model`` picks its engine (its rows batched together),
and concurrent openai clients of the base and two adapters each get PEFT's greedy tokens."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from tests.checkpoints.test_lora import _ids, two_adapters  # noqa: F401 (a fixture)
from transformer_kit.apps.serving.http import create_app
from transformer_kit.apps.serving.http import serve_in_thread as running
from transformer_kit.runtime import Engine, OnnxModel


def _ended(tokens: list[int]) -> list[int]:
    return tokens[:tokens.index(2) + 1] if 2 in tokens else tokens  # eos 2, then PEFT's padding


def test_the_base_and_two_adapters_served_at_once_each_equal_peft(two_adapters):  # noqa: F811
    _, folder, expected = two_adapters
    om = OnnxModel(folder)
    engines = {name: Engine(om, max_batch=8, adapter=name) for name in (None, *om.adapters)}
    adapters = {name: engine for name, engine in engines.items() if name is not None}
    try:
        with running(create_app(engines[None], "llama", adapters=adapters)) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
            assert [m.id for m in client.models.list().data] == ["llama", "llama:first", "llama:second"]
            cards = httpx.get(f"{url}/v1/models").json()["data"]  # as vLLM lists a base and its LoRAs
            export = folder.resolve()
            assert [(c["root"], c["parent"], c["max_model_len"]) for c in cards] == [
                (str(export), None, om.context_length),
                (str(export / "adapters" / "first.safetensors"), "llama", om.context_length),
                (str(export / "adapters" / "second.safetensors"), "llama", om.context_length)]
            assert all((export / "adapters" / f"{name}.safetensors").is_file() for name in om.adapters)
            names = {"llama": None, "llama:first": "first", "llama:second": "second"}
            asked = [(model, i) for _ in range(3) for model in names for i in range(len(_ids()))]

            def ask(job: tuple[str, int]) -> list[int]:
                model, i = job
                reply = client.completions.create(model=model, prompt=_ids()[i].tolist(), max_tokens=8,
                                                  temperature=0)
                return reply.choices[0].model_extra["token_ids"]

            with ThreadPoolExecutor(12) as pool:  # 27 concurrent clients, three models
                answers = list(pool.map(ask, asked))
            for (model, i), tokens in zip(asked, answers, strict=True):
                assert tokens == _ended(expected[names[model]][1][i].tolist()), (model, i)
            wrong = httpx.post(f"{url}/v1/completions", json={"model": "llama:third", "prompt": [5, 6]})
            assert wrong.status_code == 404
            assert "does not exist here; this server serves 'llama, llama:first, llama:second'" in (
                wrong.json()["error"]["message"])
    finally:
        for engine in engines.values():
            engine.close()
    assert engines["first"].stats.generated_tokens > 0 and engines["second"].stats.generated_tokens > 0
