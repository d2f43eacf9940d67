"""A local Triton Inference Server, for the tests and benchmarks: the ``tritonserver`` that the
``nvidia-pytriton`` wheel bundles (Triton 2.51, with its Python backend, which runs on a CPU
machine), started on 127.0.0.1 over a model repository and stopped by PID. Production runs
Triton's own container; this is the same server binary without docker.

The wheel's layout, as PyTriton itself prepares it: the server's libraries in
``nvidia_pytriton.libs/`` (on ``LD_LIBRARY_PATH``), the backends in
``pytriton/tritonserver/backends/``, and the Python backend's stub for this Python version in
``python_backend_stubs/X.Y/``, copied into ``backends/python/``. The wheel is installed without
its dependencies (it pins numpy<2): only its files are used, never ``import pytriton``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def wheel_root() -> Path | None:
    """The installed nvidia-pytriton's ``pytriton`` folder, or None."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    return root if (root / "tritonserver" / "bin" / "tritonserver").is_file() else None


def server_tree(root: Path, target: Path) -> Path:
    """A copy of the wheel's server (binary, backends, caches) with this Python's stub in place."""
    shutil.copytree(root / "tritonserver", target, ignore=shutil.ignore_patterns("python_backend_stubs"))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub"
    shutil.copy2(stub, target / "backends" / "python" / stub.name)
    return target


def model_environment(target: Path) -> Path:
    """A virtual environment for the generate model: numpy<2 of its own (this wheel's stub reads
    numpy arrays at numpy 1's layout; Triton 24.11 and later read numpy 2) and, through a
    ``.pth``, every other package of this test run's environment (transformer-kit among them).
    Raises ``subprocess.CalledProcessError`` where numpy<2 cannot be installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    site = Path(subprocess.run([str(target / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--target", str(site), "numpy<2"], check=True, capture_output=True, timeout=300)
    parent = sysconfig.get_paths()["purelib"]
    (site / "parent-environment.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    return target


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class TritonServer:
    """``tritonserver`` of ``tree`` (its libraries in ``libs``) over ``repo``, loading ``models``
    only (explicit model control: the forward model needs the onnxruntime backend, which the
    wheel does not ship), on three free ports of 127.0.0.1; ``stop`` ends it and its stubs
    (its process group) by PID."""

    def __init__(self, tree: Path, libs: Path, repo: Path, models: list[str], log: Path,
                 flags: list[str] = ()) -> None:
        self.http_port, self.grpc_port, metrics = free_ports(3)
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(libs), env.get("LD_LIBRARY_PATH")]))
        command = [str(tree / "bin" / "tritonserver"), f"--model-repository={repo}",
                   f"--backend-directory={tree / 'backends'}", f"--cache-directory={tree / 'caches'}",
                   "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                   f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
                   f"--metrics-port={metrics}", "--allow-metrics=false", "--exit-timeout-secs=5",
                   "--model-control-mode=explicit", *[f"--load-model={m}" for m in models], *flags]
        self.log = log
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)

    def wait_ready(self, seconds: float) -> None:
        """Until the server says it is ready (its models loaded); raises with the log's tail if
        it exits or is not ready within ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited ({self.process.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/v2/health/ready",
                                            timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"tritonserver not ready in {seconds} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 15 s; waits for the server."""
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # stubs left if the server died before them
            os.killpg(self.process.pid, signal.SIGKILL)


@contextlib.contextmanager
def local_server(repo: Path, models: list[str], workdir: Path, ready_seconds: float = 180,
                 flags: list[str] = ()) -> Iterator[TritonServer]:
    """The wheel's ``tritonserver`` over ``repo`` with ``models`` loaded (and the server's own
    ``flags``), ready; stopped on exit.
    ``workdir`` holds its copy of the server and its log. Raises RuntimeError when the wheel is
    not installed (``pip install --no-deps nvidia-pytriton``) or the server does not get ready."""
    root = wheel_root()
    if root is None:
        raise RuntimeError("nvidia-pytriton (the wheel with tritonserver) is not installed: pip "
                           "install --no-deps nvidia-pytriton==0.7.0")
    workdir.mkdir(parents=True, exist_ok=True)
    tree = server_tree(root, workdir / "tritonserver")
    server = TritonServer(tree, root.parent / "nvidia_pytriton.libs", repo, models, workdir / "server.log",
                          flags)
    try:
        server.wait_ready(ready_seconds)
        yield server
    finally:
        server.stop()
