"""A Hugging Face Hub cache filled here, laid out as ``huggingface_hub`` lays it out
(``models--org--name/blobs``, ``snapshots/<commit>/...`` links to the blobs, ``refs/<branch>``),
and a stand-in Hub on 127.0.0.1 that serves a few repositories and refuses the rest with the
Hub's error codes (the Hub itself cannot be reached from the tests)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
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


class _StandInHub(BaseHTTPRequestHandler):
    """The Hub's API for the repositories of ``repos`` (repo -> (commit, path -> bytes)): a
    revision's commit (main or the commit itself), the file listing, each file's metadata and
    bytes (the paths of the files sent go to ``fetched``). Anything else is refused as the Hub
    refuses: a repository named ``gated`` (403 GatedRepo), a revision named ``nope`` (404
    RevisionNotFound), a missing file (404 EntryNotFound), an unknown repository (404
    RepoNotFound)."""

    repos: ClassVar[dict[str, tuple[str, dict[str, bytes]]]] = {}
    fetched: ClassVar[list[str]] = []

    def _answer(self) -> None:
        path = unquote(self.path.split("?")[0])
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(/.*)?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        repo, revision = (api or resolve).group(1, 3 if api else 2) if api or resolve else ("", "")
        commit, files = self.repos.get(repo, ("", {}))
        if "gated" in repo:
            return self._refuse(403, "GatedRepo")
        if not files:
            return self._refuse(404, "RepoNotFound")
        if revision not in ("main", commit):
            return self._refuse(404, "RevisionNotFound")
        if api and api.group(2) == "revision":
            return self._send({"id": repo, "sha": commit, "siblings": [{"rfilename": p} for p in files]})
        if api:
            return self._send([{"type": "file", "path": p, "size": len(data),
                                "oid": hashlib.sha1(data).hexdigest()} for p, data in files.items()])
        name = resolve.group(3)
        if name not in files:
            return self._refuse(404, "EntryNotFound")
        data = files[name]
        self.send_response(200)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "GET":
            self.fetched.append(name)
            self.wfile.write(data)

    def _send(self, value: object) -> None:
        body = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def _refuse(self, status: int, code: str) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _answer

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


def repository(folder: Path, extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """A repository's files: those under ``folder`` (path -> bytes) and ``extra`` ones."""
    files = {p.relative_to(folder).as_posix(): p.read_bytes()
             for p in sorted(folder.rglob("*")) if p.is_file()}
    return {**files, **(extra or {})}


@contextmanager
def stand_in_hub(repos: dict[str, tuple[str, dict[str, bytes]]] | None = None,
                 ) -> Iterator[tuple[str, list[str]]]:
    """A local server that answers as the Hub does for ``repos`` (repo -> (commit, path ->
    bytes)) and refuses as it refuses; yields its address and the list of the files it sent."""
    handler = type("Hub", (_StandInHub,), {"repos": dict(repos or {}), "fetched": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.fetched
    finally:
        server.shutdown()
        server.server_close()
