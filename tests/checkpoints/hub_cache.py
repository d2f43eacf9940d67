"""A Hugging Face Hub cache filled here, laid out as ``huggingface_hub`` lays it out
(``models--org--name/blobs``, ``snapshots/<commit>/...`` links to the blobs, ``refs/<branch>``),
and a stand-in Hub that answers every request with one of the Hub's errors (the Hub itself
cannot be reached from the tests)."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote


def place_snapshot(cache: Path, repo: str, files: Path, commit: str,
                   refs: tuple[str, ...] = ("main",)) -> Path:
    """The files under folder (or the file) ``files`` as the snapshot ``commit`` of model
    repository ``repo`` in ``cache``, named by each branch or tag of ``refs``; returns the
    snapshot folder."""
    storage = cache / f"models--{repo.replace('/', '--')}"
    snapshot = storage / "snapshots" / commit
    paths = [files] if files.is_file() else sorted(p for p in files.rglob("*") if p.is_file())
    for path in paths:
        name = path.name if files.is_file() else path.relative_to(files).as_posix()
        blob = storage / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            shutil.copyfile(path, blob)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (storage / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshot


class _Refusing(BaseHTTPRequestHandler):
    """The Hub's answer for a repository named ``gated`` (403 GatedRepo), a revision named
    ``nope`` (404 RevisionNotFound), a file (404 EntryNotFound), and any other repository
    (404 RepoNotFound)."""

    def _answer(self) -> None:
        path = unquote(self.path)
        if "gated" in path:
            status, code = 403, "GatedRepo"
        elif "/revision/nope" in path or "/resolve/nope/" in path:
            status, code = 404, "RevisionNotFound"
        elif "/resolve/" in path:
            status, code = 404, "EntryNotFound"
        else:
            status, code = 404, "RepoNotFound"
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _answer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@contextmanager
def refusing_hub() -> Iterator[str]:
    """A local server that answers as the Hub does when it refuses; yields its address."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
