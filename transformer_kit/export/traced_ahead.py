"""Tracing the later graphs of an export in a forked process, on the other core.

torch.export runs Python on one core for seconds per graph. While this process traces the
first graph and writes its weights, a child forked from it traces the others (it has the
skeleton, the plugins and the patches already: nothing is pickled or imported again) and saves
each graph without weights; this process loads them when it gets to them. A child that dies
without a word, or is still at work well after this process traced a graph of its own (a lock
that another thread held at the fork would keep it waiting for ever), is stopped and leaves its
graphs to be traced here; one that fails says why, as tracing here would. Only where ``fork``
is safe and cheap (Linux); elsewhere the graphs are traced in turn.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import onnx_ir as ir

from transformer_kit.errors import ExportError

WEIGHT_PLACEHOLDER = "__weight_streamed_later__"  # where a traced graph's weights are not


def can_trace_ahead() -> bool:
    return sys.platform == "linux" and hasattr(os, "fork")


class TracedAhead:
    """Graphs ``names`` traced by ``trace(name) -> (graph, layers traced or None)`` in a forked
    child, saved in ``folder`` (removed as they are taken)."""

    def __init__(self, trace: Callable[[str], tuple[ir.Model, int | None]], names: list[str],
                 folder: Path) -> None:
        self.names, self.folder = list(names), folder
        self.status: int | None = None
        self.started = time.monotonic()
        self.pid = os.fork()
        if self.pid == 0:  # the child: trace, save, and leave without running this process's exit code
            # What the parent left for its garbage collector (an onnxruntime session in a cycle)
            # is not collected here: freeing a session whose threads did not come along blocks.
            gc.freeze()
            code = 0
            try:
                for name in self.names:
                    graph, layers = trace(name)
                    _save(graph, self._file(name))
                    self._file(name, ".json").write_text(json.dumps({"layers_traced": layers}))
            except BaseException as exc:
                said = {"export_error": isinstance(exc, ExportError), "message": str(exc),
                        "type": type(exc).__name__}
                self._file("error", ".txt").write_text(json.dumps(said))
                code = 1
            finally:
                os._exit(code)

    def _file(self, name: str, suffix: str = ".onnx") -> Path:
        return self.folder / f".{name}.traced{suffix}"

    def _wait(self, patience: float | None = None) -> int | None:
        """The child's exit code, waiting at most ``patience`` seconds (None: until it ends)."""
        deadline = None if patience is None else time.monotonic() + patience
        while self.status is None:
            pid, status = os.waitpid(self.pid, 0 if deadline is None else os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
            elif time.monotonic() >= deadline:
                return None
            else:
                time.sleep(0.02)
        return self.status

    def take(self, name: str, patience: float) -> tuple[ir.Model, int | None] | None:
        """Graph ``name`` and its layers traced as the child left them; ``None`` when the child
        died before saving it or is still at work after ``patience`` seconds (stopped then):
        trace it here. Raises the child's :class:`ExportError`."""
        code = self._wait(patience)
        if code is None:  # stuck (a lock another thread held when it was forked): stop it
            self.close()
            return None
        error = self._file("error", ".txt")
        if code == 1 and error.exists():
            said = json.loads(error.read_text())
            error.unlink()
            raise ExportError(said["message"] if said["export_error"]
                              else f"Export failed: {said['type']}: {said['message']}")
        path, info = self._file(name), self._file(name, ".json")
        if not info.exists():
            return None
        graph = _load(path)
        layers = json.loads(info.read_text())["layers_traced"]
        path.unlink()
        info.unlink()
        return graph, layers

    def close(self) -> None:
        """Stop the child if it still runs (an export interrupted here) and remove its files."""
        if self._wait(patience=0) is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self._wait()
        for name in [*self.names, "error"]:
            for suffix in (".onnx", ".json", ".txt"):
                self._file(name, suffix).unlink(missing_ok=True)


def _save(model: ir.Model, path: Path) -> None:
    """Save a traced graph whose weights have no value: each points at a placeholder file."""
    for value in model.graph.initializers.values():
        if value.const_value is None:
            value.const_value = ir.ExternalTensor(WEIGHT_PLACEHOLDER, 0, 0, value.dtype, shape=value.shape,
                                                  name=value.name, base_dir=str(path.parent))
    ir.save(model, path)


def _load(path: Path) -> ir.Model:
    model = ir.load(path)
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor) and tensor.location == WEIGHT_PLACEHOLDER:
            value.const_value = None
    return model
