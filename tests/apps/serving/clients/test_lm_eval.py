"""lm-evaluation-harness pointed at the server, on tasks of its own YAML over a local JSON file
(no download): ``local-chat-completions`` on a generate_until task answers each question with
the export's own greedy reply, and scores exact_match on it; ``local-completions`` on a
multiple-choice task (loglikelihoods: ``echo`` with ``logprobs``) scores each choice as lm-eval's
own ``hf`` backend does on the same transformers checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager

QUESTIONS = ["What is the weather in Paris?", "Tell me about café culture."]
UNTIL = ["\n\n"]


def _task(folder: Path, name: str, docs: list[dict], **fields) -> TaskManager:
    """lm-eval's task ``name`` over ``docs`` (a JSON file in ``folder``), its YAML beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.json"
    data.write_text(json.dumps(docs), encoding="utf-8")
    task = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
            "test_split": "test", **fields}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(task), encoding="utf-8")
    return TaskManager(include_path=str(folder), include_defaults=False)  # its own tasks only: seconds


def _evaluate(model: str, model_args: dict, name: str, tasks: TaskManager, **options) -> dict:
    results = simple_evaluate(model=model, model_args=model_args, tasks=[name], task_manager=tasks,
                              batch_size=1, log_samples=True, bootstrap_iters=0, **options)
    return results


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """datasets reads the local JSON file without asking the Hub."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_local_chat_completions_answers_a_generate_until_task_with_the_greedy_reply(chat_server, tmp_path):
    expected = [chat_server.reply([{"role": "user", "content": q}], 12, stop=UNTIL)["content"]
                for q in QUESTIONS]
    docs = [{"question": QUESTIONS[0], "answer": expected[0]},  # matches: exact_match 1
            {"question": QUESTIONS[1], "answer": "sunny, 21 degrees"}]  # does not: 0
    tasks = _task(tmp_path, "tk_clients_generate", docs, output_type="generate_until",
                  doc_to_text="{{question}}", doc_to_target="{{answer}}",
                  generation_kwargs={"until": UNTIL, "max_gen_toks": 12, "do_sample": False},
                  metric_list=[{"metric": "exact_match"}])
    args = {"model": chat_server.name, "base_url": f"{chat_server.base_url}/chat/completions",
            "tokenizer_backend": "none", "tokenized_requests": False, "num_concurrent": 1, "max_retries": 1}
    results = _evaluate("local-chat-completions", args, "tk_clients_generate", tasks,
                        apply_chat_template=True)
    samples = sorted(results["samples"]["tk_clients_generate"], key=lambda s: s["doc_id"])
    assert [s["resps"][0][0] for s in samples] == expected
    assert results["results"]["tk_clients_generate"]["exact_match,none"] == 0.5
    assert sorted(chat_server.prompts[-2:]) == sorted(chat_server.prompt_ids([{"role": "user", "content": q}])
                                                      for q in QUESTIONS)


CHOICE_DOCS = [
    {"question": "What is the weather in Paris?", "choices": ["sunny", "rain", "snow"], "label": 0},
    {"question": "Tell me about café culture.", "choices": ["coffee", "tea"], "label": 1},
    {"question": "Hello there", "choices": ["hi", "good day", "bye"], "label": 2}]


def test_local_completions_scores_a_multiple_choice_task_as_the_hf_backend(chat_server, tmp_path):
    tasks = _task(tmp_path, "tk_clients_choice", CHOICE_DOCS, output_type="multiple_choice",
                  doc_to_text="Question: {{question}}\nAnswer:", doc_to_choice="{{choices}}",
                  doc_to_target="{{label}}", metric_list=[{"metric": "acc"}])
    checkpoint = str(chat_server.checkpoint)
    served = _evaluate("local-completions", {
        "model": chat_server.name, "base_url": f"{chat_server.base_url}/completions", "tokenizer": checkpoint,
        "tokenizer_backend": "huggingface", "tokenized_requests": True, "num_concurrent": 1,
        "max_retries": 1}, "tk_clients_choice", tasks)
    reference = _evaluate("hf", {"pretrained": checkpoint, "dtype": "float32", "device": "cpu"},
                          "tk_clients_choice", tasks)

    def scores(results: dict) -> list[list[float]]:
        samples = sorted(results["samples"]["tk_clients_choice"], key=lambda s: s["doc_id"])
        return [[r[0][0] for r in s["resps"]] for s in samples]

    got, expected = scores(served), scores(reference)
    assert [len(s) for s in got] == [len(d["choices"]) for d in CHOICE_DOCS]
    np.testing.assert_allclose(np.concatenate(got), np.concatenate(expected), atol=1e-3)
    assert all(s < 0 for s in np.concatenate(got))  # log probabilities of real tokens
    accuracy = [r["results"]["tk_clients_choice"]["acc,none"] for r in (served, reference)]
    assert accuracy[0] == accuracy[1]
