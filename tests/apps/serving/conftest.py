"""Shared by the serving tests: the tiny decoder's export in onnxruntime, and a server on
127.0.0.1 run by uvicorn in a thread of this process."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from transformer_kit.export import OnnxModel


@pytest.fixture(scope="session")
def onnx_model(exported) -> OnnxModel:
    _, folder = exported
    return OnnxModel(folder / "onnx", providers="cpu")


@contextlib.contextmanager
def running(app):
    """Serve ``app`` on a free port of 127.0.0.1; yields the base URL; stops it on exit."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
