"""The sentence-embedding benchmark runs end to end on a tiny sentence-transformers folder: the
kit's float32 and int8 runners, and sentence-transformers' torch runner where it is installed
(its ONNX backend needs optimum, a benchmark-only peer: left out here). The vectors are
checked, the times only printed, never asserted."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import embeddings  # noqa: E402  (benchmarks/ is no package)


def test_vocabulary_has_bert_size_and_no_duplicates():
    vocab = embeddings.vocabulary()
    assert len(vocab) == 30522 == len(set(vocab))
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.mark.parametrize("kind", ["short", "long", "mixed"])
def test_texts_have_the_asked_token_lengths(kind):
    tokenizer = embeddings.tokenizer()
    low, high = embeddings.LENGTHS[kind]
    lengths = [len(tokenizer.encode(t).ids) for t in embeddings.texts(kind, 20)]
    assert all(low - 1 <= n <= high for n in lengths), lengths
    assert embeddings.texts(kind, 5) == embeddings.texts(kind, 20)[:5]  # deterministic prefixes


def test_sized_calls_fill_the_cell_in_whole_batches():
    assert embeddings.sized(0.5, 32, 32, 4.0) == 256
    assert embeddings.sized(10.0, 32, 32, 4.0) == 32  # at least one batch
    assert embeddings.sized(0.1, 8, 1, 1.0) == 80
    assert embeddings.sized(5.0, 8, 1, 1.0) == 4


def test_embeddings_benchmark_runs_and_the_kit_equals_sentence_transformers(tmp_path):
    with_st = importlib.util.find_spec("sentence_transformers") is not None
    runners = ["kit float32", "kit int8", *(["ST torch"] if with_st else [])]
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "embeddings.py"), "--shapes", "tiny", "--rounds", "1",
         "--cell-seconds", "0.2", "--workdir", str(tmp_path), "--runners", *runners],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    tiny = json.loads((tmp_path / "embeddings-results.json").read_text())["tiny"]
    assert list(tiny["workloads"]) == [f"{length}, batch {batch}" for length in ("short", "long", "mixed")
                                       for batch in (1, 32)]
    for row in tiny["workloads"].values():
        assert sorted(row["sentences_per_s"]) == sorted(runners)
        assert row["texts"] % row["batch"] == 0
    correctness = tiny["correctness"]
    assert correctness["kit int8 vs kit float32, mean cosine"] > 0.99
    if with_st:
        assert correctness["kit float32 vs ST torch, max abs diff"] < 1e-5
        assert "kit float32 / ST torch" in tiny["workloads"]["mixed, batch 32"]["ratios"]
    assert "| short (12), batch 1 |" in result.stdout
