"""Shared fixtures: a clean process-wide registry around tests that register plugins, and
each pytest-xdist worker's share of the cores."""

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
