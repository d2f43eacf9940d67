"""Sentence embeddings: transformer-kit's onnxruntime against sentence-transformers (issue 26).

Two shapes, random weights written as sentence-transformers folders in the Hugging Face hub's
layout (``modules.json``, ``1_Pooling``, ``2_Normalize``, a ``BertModel`` saved with
``save_pretrained`` and a 30,522-token WordPiece vocabulary made here):

- ``minilm``: all-MiniLM-L6-v2's shape: 6 layers, 384 wide, 12 heads, 1536 ff, mean pooling
  + Normalize, max_seq_length 256;
- ``bge-base``: bge-base-en-v1.5's shape: 12 layers, 768 wide, 12 heads, 3072 ff, CLS pooling
  + Normalize, max_seq_length 512.

Runners, each in its own process with 2 threads (onnxruntime ``intra_op_num_threads=2``,
``torch.set_num_threads(2)``, ``OMP_NUM_THREADS=2``):

- ``kit float32``, ``kit int8``: ``OnnxModel(export_onnx(tk.from_hf(folder), quantize=...))``
  ``.embed(texts, batch_size=...)``;
- ``ST torch``: ``SentenceTransformer(folder, device="cpu").encode(texts, batch_size=...)``;
- ``ST onnx``: ``SentenceTransformer(folder, backend="onnx")`` (optimum's onnxruntime model,
  exported once before the timing, on the CPU provider) ``.encode``.

sentence-transformers 6 needs transformers >= 5 and optimum-onnx 0.1 needs transformers < 4.58,
so the sentence-transformers runners can run in another interpreter (``--peer-python``, e.g. a
venv with ``sentence-transformers[onnx]==5.7.0``); the kit's run in this one.

Workloads: short (~12 tokens), long (~200 tokens) and mixed (8 to 256 tokens) texts, each at
batch 1 (one text per call) and batch 32 (``--batch32-texts`` texts per call, batch_size=32).
Each round times every runner once per workload, the order rotating, each timed call after an
untimed one of the same runner (settling: thread pools and allocators); sentences/s are medians
over rounds, ratios are medians of within-round ratios. Also reported: the kit's vectors against
sentence-transformers' (max abs difference) and int8 against float32 (cosine similarity).

    pip install -e ".[dev]"; python -m venv stvenv; stvenv/bin/pip install "sentence-transformers[onnx]"
    python benchmarks/embeddings.py --peer-python stvenv/bin/python [--rounds 5] [--shapes minilm bge-base]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

THREADS = 2
VOCAB = 30522
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SHAPES: dict[str, dict] = {
    "minilm": {"layers": 6, "hidden": 384, "heads": 12, "ff": 1536, "pooling": "mean",
               "max_seq_length": 256, "title": "all-MiniLM-L6-v2 shape"},
    "bge-base": {"layers": 12, "hidden": 768, "heads": 12, "ff": 3072, "pooling": "cls",
                 "max_seq_length": 512, "title": "bge-base-en-v1.5 shape"},
    # max_seq_length 256: every text here fits (a server refuses longer inputs, as it should)
    "tiny": {"layers": 2, "hidden": 32, "heads": 4, "ff": 64, "pooling": "mean",
             "max_seq_length": 256, "title": "tiny (smoke test)"},
}
LENGTHS = {"short": (12, 12), "long": (200, 200), "mixed": (8, 256)}
KIT_RUNNERS = ("kit float32", "kit int8")
PEER_RUNNERS = ("ST torch", "ST onnx")
_COMMON = ("the of and to in is was for that on with as by at from it an be this are which or his "
          "had not but were her they have one all their has there been more new also when who "
          "after into other first would time than two some its only most can over many these "
          "world city people year state made used such between during through where under while "
          "system water music house model search query answer rank vector sentence embedding "
          "language small large early later river north south market light sound power group")
_CONSONANTS = "b c d f g h j k l m n p r s t v w z br ch cl cr dr fl gr pl pr sh st th tr"
_VOWELS = "a e i o u ai ea ee oa ou"
COMMON, CONSONANTS, VOWELS = _COMMON.split(), _CONSONANTS.split(), _VOWELS.split()


def vocab_size(shape: str) -> int:
    return 1000 if shape == "tiny" else VOCAB


# -- the checkpoints -------------------------------------------------------------------------
def syllables() -> list[str]:
    return [c + v for c in CONSONANTS for v in VOWELS]


def vocabulary(size: int = VOCAB) -> list[str]:
    """A WordPiece vocabulary of exactly ``size`` entries: BERT's special tokens, characters
    (whole and ``##``), common English words, syllables (whole and ``##``) and two- and
    three-syllable words, in that order."""
    chars = [chr(c) for c in range(33, 127) if not chr(c).isupper()]
    sylls = syllables()
    words = list(dict.fromkeys([*SPECIAL, *chars, *(f"##{c}" for c in chars if c.isalnum()), *COMMON,
                                *sylls, *(f"##{s}" for s in sylls)]))
    seen = set(words)
    for a in sylls:
        for b in sylls:
            if len(words) >= size:
                return words[:size]
            if a + b not in seen:
                seen.add(a + b)
                words.append(a + b)
    rng = np.random.default_rng(0)
    words = words[:size]
    while len(words) < size:
        word = "".join(rng.choice(sylls, 3))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def tokenizer(size: int = VOCAB):
    """BERT's uncased WordPiece tokenizer over :func:`vocabulary`: [CLS] A [SEP]."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab = vocabulary(size)
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))])
    return tok


def write_checkpoint(folder: Path, shape: str, seed: int = 0) -> Path:
    """A random sentence-transformers model of ``shape`` in ``folder`` (hub layout), unless one
    is already there."""
    import torch
    import transformers as hf

    if (folder / "modules.json").exists():
        return folder
    s = SHAPES[shape]
    size = vocab_size(shape)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = hf.BertConfig(vocab_size=size, hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                           num_attention_heads=s["heads"], intermediate_size=s["ff"],
                           max_position_embeddings=512, pad_token_id=0)
    hf.BertModel(config).save_pretrained(folder)  # with its pooler, as hub checkpoints
    tok = tokenizer(size)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "vocab.txt").write_text("\n".join(vocabulary(size)) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "pad_token": "[PAD]",
        "cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]", "mask_token": "[MASK]",
        "model_max_length": s["max_seq_length"]}, indent=1))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]",
        "mask_token": "[MASK]"}, indent=1))
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": s["max_seq_length"], "do_lower_case": False}))
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}))
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ], indent=1))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": s["hidden"], "pooling_mode_cls_token": s["pooling"] == "cls",
        "pooling_mode_mean_tokens": s["pooling"] == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}, indent=1))
    (folder / "2_Normalize").mkdir(exist_ok=True)
    return folder


# -- the texts -------------------------------------------------------------------------------
#: The texts drawn so far per (kind, vocabulary, seed), with the generator that goes on drawing
#: them: a workload asks for the same texts many times (its probe, its cells, its operations), and
#: each text costs a tokenization per word.
_DRAWN: dict[tuple[str, int, int], tuple[np.random.Generator, list[str]]] = {}


def texts(kind: str, count: int, size: int = VOCAB, seed: int = 0) -> list[str]:
    """``count`` English-ish sentences whose tokenized lengths ([CLS] and [SEP] included) are
    ``LENGTHS[kind]`` (uniform between its bounds; a text may end one token short): common
    words, syllable words in the vocabulary, and now and then a longer word cut into pieces.
    The first ``k`` of ``count`` texts are the ``k`` texts asked for alone."""
    key = (kind, size, seed)
    if key not in _DRAWN:
        _DRAWN[key] = (np.random.default_rng(seed + {"short": 0, "long": 1, "mixed": 2}[kind]), [])
    rng, out = _DRAWN[key]
    tok = tokenizer(size)
    sylls = syllables()
    low, high = LENGTHS[kind]
    while len(out) < count:
        target = int(rng.integers(low, high + 1))
        words: list[str] = []
        while True:
            draw = rng.random()
            if draw < 0.6:
                word = str(rng.choice(COMMON))
            elif draw < 0.9:
                word = "".join(rng.choice(sylls, 2))
            else:
                word = "".join(rng.choice(sylls, 4))
            if len(tok.encode(" ".join([*words, word]) + ".").ids) > target:
                if word in COMMON:  # one token too many: done (a longer word: try another)
                    break
                continue
            words.append(word)
        sentence = " ".join(words) + "."
        out.append(sentence[0].upper() + sentence[1:])
    return out[:count]


def flops(shape: str, batch_texts: list[str]) -> float:
    """Floating-point operations of the encoder on ``batch_texts`` (their own tokens, cut to
    max_seq_length; padding not counted): per token and layer, 2 x (4 d^2 + 2 d ff) for the
    products with weights and 4 x length x d for attention's two products."""
    s = SHAPES[shape]
    tok = tokenizer(vocab_size(shape))
    d, ff = s["hidden"], s["ff"]
    total = 0.0
    for encoding in tok.encode_batch(batch_texts):
        n = min(len(encoding.ids), s["max_seq_length"])
        total += s["layers"] * n * (2 * (4 * d * d + 2 * d * ff) + 4 * n * d)
    return total


def workload_texts(shape: str, length: str, batch: int, count: int) -> list[str]:
    """The texts of one timed call: ``count`` of them (batch 1: one call per text)."""
    return texts(length, count, vocab_size(shape), seed=batch)


# -- workers: one process per runner ---------------------------------------------------------
def load_runner(runner: str, folder: str):
    """A function (texts, batch_size) -> (n, dim) float32 for ``runner``, and its versions."""
    if runner.startswith("kit"):
        import onnxruntime as ort

        import transformer_kit
        from transformer_kit.runtime import OnnxModel

        options = ort.SessionOptions()
        options.intra_op_num_threads = THREADS
        om = OnnxModel(folder, providers="cpu", session_options=options)
        versions = {"transformer-kit": transformer_kit.__version__, "onnxruntime": ort.__version__}
        return (lambda batch, size: om.embed(batch, batch_size=size)), versions
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import __version__ as st_version

    torch.set_num_threads(THREADS)
    versions = {"sentence-transformers": st_version, "transformers": transformers.__version__,
                "torch": torch.__version__}
    if runner == "ST onnx":
        from importlib.metadata import version

        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = THREADS
        model = SentenceTransformer(folder, device="cpu", backend="onnx", model_kwargs={
            "provider": "CPUExecutionProvider", "session_options": options})
        versions.update({"onnxruntime": ort.__version__, "optimum": version("optimum"),
                         "optimum-onnx": version("optimum-onnx")})
    else:
        model = SentenceTransformer(folder, device="cpu")

    def encode(batch: list[str], size: int) -> np.ndarray:
        return model.encode(batch, batch_size=size, convert_to_numpy=True, show_progress_bar=False)

    return encode, versions


def worker(runner: str, folder: str) -> None:
    """Answers JSON lines on stdin: ``load`` (a workload's texts and batch size), ``run`` (a
    short untimed call, then one timed pass over a workload: its seconds), ``vectors`` (embeddings saved as
    .npy), ``stop``. Anything the libraries print goes to stderr."""
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    encode, versions = load_runner(runner, folder)
    loaded: dict[str, tuple[list[str], int]] = {}

    def once(name: str, settle: bool = False) -> float:
        batch, size = loaded[name]
        if settle:  # a short untimed call: the first two texts
            batch = batch[:2]
        start = time.perf_counter()
        if size == 1:
            for text in batch:
                encode([text], 1)
        else:
            encode(batch, size)
        return time.perf_counter() - start

    protocol.write(json.dumps({"versions": versions}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        message = json.loads(line)
        answer: dict = {}
        if message["do"] == "load":
            loaded[message["name"]] = (message["texts"], message["batch"])
        elif message["do"] == "run":
            once(message["name"], settle=True)  # the timed pass follows a call of the same runner
            answer["seconds"] = once(message["name"])
        elif message["do"] == "vectors":
            np.save(message["path"], encode(message["texts"], 32))
        else:
            break
        protocol.write(json.dumps(answer) + "\n")
        protocol.flush()


class Worker:
    """A runner's process (``python`` running this file with ``--worker``)."""

    def __init__(self, runner: str, folder: Path, python: str, log: Path) -> None:
        self.runner = runner
        self.log = log
        self.process = subprocess.Popen(
            [python, __file__, "--worker", runner, "--folder", str(folder)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
            env={**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "true"})
        self.versions: dict[str, str] = self._read()["versions"]

    def _read(self) -> dict:
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the {self.runner} worker ended; its log {self.log} ends with:\n"
                               + self.log.read_text()[-3000:])
        return json.loads(answer)

    def ask(self, **message) -> dict:
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.process.stdin.write(json.dumps({"do": "stop"}) + "\n")
        self.process.stdin.flush()
        self.process.wait(timeout=60)


# -- preparing each runner's folder ----------------------------------------------------------
def export_kit(checkpoint: Path, workdir: Path) -> dict[str, Path]:
    """The kit's float32 and int8 exports of ``tk.from_hf(checkpoint)`` (made once per workdir)."""
    import transformer_kit as tk
    from transformer_kit.export import export_onnx

    folders = {"kit float32": workdir / f"{checkpoint.name}-kit-float32",
               "kit int8": workdir / f"{checkpoint.name}-kit-int8"}
    model = None
    for runner, folder in folders.items():
        if not (folder / "manifest.json").exists():
            model = model or tk.from_hf(checkpoint)
            report = export_onnx(model, folder, quantize="int8" if runner == "kit int8" else None)
            print(report, file=sys.stderr)
    return folders


def prepare_st_onnx(source: str, target: str) -> None:
    """A copy of ``source`` holding sentence-transformers' own ONNX export (``onnx/model.onnx``,
    made by ``backend="onnx"`` on first load, then saved), so the timed runs load it."""
    import shutil

    from sentence_transformers import SentenceTransformer

    shutil.copytree(source, target, dirs_exist_ok=True)
    model = SentenceTransformer(target, device="cpu", backend="onnx",
                                model_kwargs={"provider": "CPUExecutionProvider"})
    model.save_pretrained(target)


def peer_has(python: str, module: str) -> bool:
    """Whether ``python`` has ``module`` installed (found, not imported: importing
    sentence-transformers takes seconds)."""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


# -- timing ----------------------------------------------------------------------------------
#: Texts of the probe that sizes each workload (batch 1: that many one-text calls).
PROBE = {1: 8, 32: 32}
#: (faster, baseline) pairs whose speed ratio is reported.
RATIOS = (("kit float32", "ST onnx"), ("kit float32", "ST torch"), ("kit int8", "ST torch"),
          ("kit int8", "ST onnx"))
#: The issue's targets: (runner, peer, workloads, least ratio).
TARGETS = (("kit float32", "ST onnx", ("mixed, batch 1",), 1.3),
           ("kit float32", "ST onnx", ("mixed, batch 32",), 1.1),
           ("kit float32", "ST torch", ("mixed, batch 1", "mixed, batch 32"), 2.0),
           ("kit int8", "ST torch", ("mixed, batch 1", "mixed, batch 32"), 3.0))


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def sized(probe_seconds: float, probe_texts: int, batch: int, cell_seconds: float) -> int:
    """Texts per timed call such that one call of every runner adds up to about
    ``cell_seconds`` (from the runners' seconds on the probe, added up): a multiple of ``batch``,
    at least one batch (batch 1: at least 4 calls)."""
    count = cell_seconds / probe_seconds * probe_texts
    if batch == 1:
        return max(4, round(count))
    return max(batch, round(count / batch) * batch)


def matmul_peak(progress, task, shape: str) -> float:
    """onnxruntime's float32 MatMul GFLOP/s on 2 threads now (the kit's probe), while the
    workers wait."""
    from transformer_kit.apps.benchmark import matmul_peak_probe

    progress.update(task, description=f"{shape}: MatMul peak probe")
    return matmul_peak_probe(threads=THREADS)() / 1e9


def measure_shape(shape: str, workdir: Path, runners: dict[str, tuple[Path, str]], rounds: int,
                  cell_seconds: float, deadline: float, progress) -> dict:
    """Every runner on every workload of ``shape`` in up to ``rounds`` interleaved rounds (no
    round starts after ``deadline``, a ``time.monotonic()``; at least one runs)."""
    workers = {}
    for name, (folder, python) in runners.items():
        workers[name] = Worker(name, folder, python, workdir / f"{shape}-{name.replace(' ', '-')}.log")
    names = list(workers)
    workloads: dict[str, tuple[str, int, int]] = {}
    task = progress.add_task(f"{shape}: probes", total=len(LENGTHS) * 2 * len(names) * (rounds + 2))
    for length in LENGTHS:
        for batch in (1, 32):
            wname = f"{length}, batch {batch}"
            probe = workload_texts(shape, length, batch, PROBE[batch])
            total = 0.0
            for name in names:  # the probe is the warm-up too (the final texts begin with it)
                progress.update(task, description=f"{shape}: probe {wname}, {name}")
                workers[name].ask(do="load", name=wname, texts=probe, batch=batch)
                total += workers[name].ask(do="run", name=wname)["seconds"]
                progress.advance(task, 2)
            count = sized(total, len(probe), batch, cell_seconds)
            workloads[wname] = (length, batch, count)
            for name in names:
                workers[name].ask(do="load", name=wname, texts=workload_texts(shape, length, batch, count),
                                  batch=batch)
    peak = [matmul_peak(progress, task, shape)]
    seconds: dict[str, dict[str, list[float]]] = {w: {r: [] for r in workers} for w in workloads}
    for index in range(rounds):
        if index and time.monotonic() > deadline:
            progress.update(task, description=f"{shape}: out of time after {index} rounds")
            break
        for offset, wname in enumerate(workloads):
            shift = (index + offset) % len(names)
            for name in [*names[shift:], *names[:shift]]:
                progress.update(task, description=f"{shape}: round {index + 1}/{rounds}, {wname}, {name}")
                seconds[wname][name].append(workers[name].ask(do="run", name=wname)["seconds"])
                progress.advance(task)
    peak.append(matmul_peak(progress, task, shape))
    check = texts("mixed", 64, vocab_size(shape), seed=99)
    vectors = {}
    for name, worker_ in workers.items():
        path = workdir / f"{shape}-{name.replace(' ', '-')}-vectors.npy"
        worker_.ask(do="vectors", texts=check, path=str(path))
        vectors[name] = np.load(path)
    versions = {name: w.versions for name, w in workers.items()}
    for worker_ in workers.values():
        worker_.close()
    result: dict = {"workloads": {}, "versions": versions, "correctness": {}, "matmul_peak_gflop_per_s": peak,
                    "rounds": len(next(iter(seconds.values()))[names[0]])}
    for wname, (length, batch, count) in workloads.items():
        times = seconds[wname]
        work = flops(shape, workload_texts(shape, length, batch, count))
        row = {"length": length, "batch": batch, "texts": count, "seconds": times,
               "sentences_per_s": {r: count / statistics.median(t) for r, t in times.items()},
               "gflop_per_s": {r: work / statistics.median(t) / 1e9 for r, t in times.items()},
               "ratios": {}}
        for fast, base in RATIOS:
            if fast in times and base in times:
                row["ratios"][f"{fast} / {base}"] = statistics.median(
                    b / f for b, f in zip(times[base], times[fast], strict=True))
        result["workloads"][wname] = row
    ref = vectors.get("ST torch")
    corr = result["correctness"]
    if ref is not None:
        for name in ("kit float32", "kit int8", "ST onnx"):
            if name in vectors:
                corr[f"{name} vs ST torch, max abs diff"] = float(np.abs(vectors[name] - ref).max())
                corr[f"{name} vs ST torch, mean cosine"] = float(cosine(vectors[name], ref).mean())
    if "kit int8" in vectors and "kit float32" in vectors:
        cos = cosine(vectors["kit int8"], vectors["kit float32"])
        corr["kit int8 vs kit float32, mean cosine"] = float(cos.mean())
        corr["kit int8 vs kit float32, min cosine"] = float(cos.min())
    return result


def print_shape(shape: str, result: dict) -> None:
    s = SHAPES[shape]
    print(f"\n### {s['title']}: {s['layers']} layers, {s['hidden']} wide, {s['heads']} heads, "
          f"{s['ff']} ff, {vocab_size(shape)} vocabulary, {s['pooling']} pooling + Normalize, "
          f"max_seq_length {s['max_seq_length']}\n")
    rows = result["workloads"]
    runners = list(next(iter(rows.values()))["sentences_per_s"])
    ratios = [f"{a} / {b}" for a, b in RATIOS if a in runners and b in runners]
    print(f"| texts (tokens), batch | texts a call | {' | '.join(runners)} | {' | '.join(ratios)} |")
    print(f"|---|---:|{'---:|' * (len(runners) + len(ratios))}")
    for row in rows.values():
        low, high = LENGTHS[row["length"]]
        tokens = f"{low}" if low == high else f"{low}-{high}"
        rates = " | ".join(f"{row['sentences_per_s'][r]:.1f}" for r in runners)
        shown = " | ".join(f"{row['ratios'][r]:.2f}x" for r in ratios)
        print(f"| {row['length']} ({tokens}), batch {row['batch']} | {row['texts']} | {rates} | {shown} |")
    print(f"\nsentences/s: medians over {result['rounds']} rounds; ratios: medians of within-round ratios "
          "(> 1: the first is faster)\n")
    peaks = " and ".join(f"{p:.0f}" for p in result["matmul_peak_gflop_per_s"])
    print("Arithmetic rate on the texts' own tokens (padding not counted; int8: the float32 count), "
          f"GFLOP/s; onnxruntime's float32 MatMul peak on 2 threads: {peaks} (before and after)\n")
    print(f"| texts, batch | {' | '.join(runners)} |")
    print(f"|---|{'---:|' * len(runners)}")
    for wname, row in rows.items():
        rates = " | ".join(f"{row['gflop_per_s'][r]:.0f}" for r in runners)
        print(f"| {wname} | {rates} |")
    print()
    for key, value in result["correctness"].items():
        print(f"- {key}: {value:.3g}" if "diff" in key else f"- {key}: {value:.5f}")
    print()
    for fast, base, names, least in TARGETS:
        for wname in names:
            ratio = rows[wname]["ratios"].get(f"{fast} / {base}")
            if ratio is not None:
                verdict = "met" if ratio >= least else f"MISSED by {(1 - ratio / least):.0%}"
                print(f"- target {fast} >= {least}x {base}, {wname}: {ratio:.2f}x, {verdict}")
    cos = result["correctness"].get("kit int8 vs kit float32, mean cosine")
    if cos is not None:
        print(f"- target int8 mean cosine to float32 >= 0.99: {cos:.4f}, "
              f"{'met' if cos >= 0.99 else 'MISSED'}")


def plot(results: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.2), squeeze=False)
    for ax, (shape, result) in zip(axes[0], results.items(), strict=True):
        rows = result["workloads"]
        runners = list(next(iter(rows.values()))["sentences_per_s"])
        width = 0.8 / len(runners)
        for i, runner in enumerate(runners):
            values = [row["sentences_per_s"][runner] for row in rows.values()]
            ax.bar(np.arange(len(rows)) + i * width, values, width, label=runner)
        ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2, [w.replace(", ", "\n") for w in rows],
                      fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("sentences/s (log)")
        ax.set_title(SHAPES[shape]["title"])
        ax.legend(fontsize=8)
    fig.suptitle(f"Sentence embeddings, {THREADS} threads each, 2-core CPU")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["minilm", "bge-base"], choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cell-seconds", type=float, default=4.0,
                        help="one timed call of every runner adds up to about this (sizes the calls)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="no round starts after this many minutes (shared out over the shapes)")
    parser.add_argument("--peer-python", default=sys.executable,
                        help="the interpreter of the sentence-transformers runners")
    parser.add_argument("--runners", nargs="+", default=[*KIT_RUNNERS, *PEER_RUNNERS],
                        choices=[*KIT_RUNNERS, *PEER_RUNNERS])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--png", type=Path, default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prepare-st-onnx", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.folder)
        return 0
    if args.prepare_st_onnx:
        prepare_st_onnx(*args.prepare_st_onnx)
        return 0
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-embeddings-"))
    workdir.mkdir(parents=True, exist_ok=True)
    wanted = list(args.runners)
    missing = []
    if "ST torch" in wanted and not peer_has(args.peer_python, "sentence_transformers"):
        missing.append("ST torch")
    if "ST onnx" in wanted and not peer_has(args.peer_python, "sentence_transformers, optimum.onnxruntime"):
        missing.append("ST onnx")
    for name in missing:
        print(f"skipping {name}: {args.peer_python} cannot import it (pip install "
              "'sentence-transformers[onnx]')", file=sys.stderr)
        wanted.remove(name)
    load = os.getloadavg()
    started, begun = datetime.now(UTC), time.monotonic()
    results: dict[str, dict] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=Console(stderr=True)) as progress:
        for shape in args.shapes:
            checkpoint = write_checkpoint(workdir / shape, shape)
            folders: dict[str, tuple[Path, str]] = {}
            kit = export_kit(checkpoint, workdir)
            st_onnx = workdir / f"{shape}-st-onnx"
            if "ST onnx" in wanted and not (st_onnx / "onnx" / "model.onnx").exists():
                subprocess.run([args.peer_python, __file__, "--prepare-st-onnx", str(checkpoint),
                                str(st_onnx)], check=True, stdout=sys.stderr)
            for name in wanted:
                folders[name] = ((kit[name], sys.executable) if name in kit else
                                 (st_onnx if name == "ST onnx" else checkpoint, args.peer_python))
            left = len(args.shapes) - args.shapes.index(shape)
            deadline = (float("inf") if args.minutes is None else
                        time.monotonic() + (begun + 60 * args.minutes - time.monotonic()) / left)
            results[shape] = measure_shape(shape, workdir, folders, args.rounds, args.cell_seconds,
                                           deadline, progress)
            (workdir / "embeddings-results.json").write_text(json.dumps(results, indent=1))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"\n{started:%Y-%m-%d %H:%M} UTC, {cpu}, {os.cpu_count()} cores (load average "
          f"{load[0]:.1f} before, {os.getloadavg()[0]:.1f} after), {THREADS} threads a runner, "
          f"up to {args.rounds} rounds\n    {' '.join(['python', *sys.argv])}\n")
    versions = {}
    for result in results.values():
        for name, v in result["versions"].items():
            versions[name] = ", ".join(f"{k} {x}" for k, x in v.items())
    for name, text in versions.items():
        print(f"- {name}: {text}")
    for shape, result in results.items():
        print_shape(shape, result)
    print(f"\nresults: {workdir / 'embeddings-results.json'}")
    if args.png:
        plot(results, args.png)
        print(f"plot: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
