"""A client's own virtual environment, layered over this one, for a client whose pins clash with
the dev extra's (tests/apps/serving/clients/).

:func:`client_env` makes a virtual environment once per machine, in a cache folder keyed by the
client's pins, ``constraints.txt`` and this environment's distributions, and returns its
Python. The environment holds only what the client needs and this one lacks or holds at another
version: a ``.pth`` file puts this environment's site-packages after its own, so torch,
transformers and the rest are shared (linked by the path, not installed again) while its own
versions (guidellm's ``click~=8.4.0``, say) come first. pip installs into it with this
environment's pip, seeing this environment's distributions as installed: it adds only what is
missing or at a version the client's pins exclude. Safe across processes (pytest-xdist's workers):
one makes it, the others wait on a file lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: guidellm pins click~=8.4.0 (the kit's CLI and the dev extra run 8.5), and sanic's multidict<7
#: (aiohttp's, under Ray, is 7): an environment of its own (pyproject.toml's dev extra says why).
GUIDELLM = ("guidellm==0.8.1",)
_DONE = "client-env.json"


def cache_root() -> Path:
    """Where the environments live: ``TK_CLIENT_ENVS``, else ``~/.cache/transformer-kit/client-envs``."""
    given = os.environ.get("TK_CLIENT_ENVS")
    return Path(given) if given else Path.home() / ".cache" / "transformer-kit" / "client-envs"


def _site_dirs() -> list[str]:
    """This environment's site-packages (purelib, then platlib where it differs)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def _key(requirements: Sequence[str]) -> str:
    """The environment's cache key: the pins, constraints.txt, the Python and this environment's
    distributions (what pip finds installed decides what it adds)."""
    here = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions(path=_site_dirs()))
    constraints = (ROOT / "constraints.txt").read_text(encoding="utf-8")
    blob = json.dumps([list(requirements), constraints, sys.version, here])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _layer(folder: Path) -> Path:
    """Point the environment at this one's site-packages (after its own); its Python."""
    python = folder / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(python), "-c", where], check=True, capture_output=True,
                               text=True).stdout.strip())
    assert site.is_relative_to(folder), site  # the environment's own, never its base's
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in _site_dirs())
    pth = site / "_transformer_kit_base.pth"
    if not pth.exists() or pth.read_text(encoding="utf-8") != lines:
        pth.write_text(lines, encoding="utf-8")
    return python


def client_env(name: str, requirements: Sequence[str]) -> Path:
    """The Python of the environment ``name`` holding ``requirements`` over this one (made here
    the first time, with ``constraints.txt``; later calls, on any process, find it)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    folder = root / f"{name}-{_key(requirements)}"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / _DONE).exists():
            return _layer(folder)
        shutil.rmtree(folder, ignore_errors=True)  # a make that was cut short
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
        python = _layer(folder)
        # this environment's pip, run by the new Python: it installs there; --no-compile, as a
        # client imports a small part of what it installs (compiled on first import)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-compile",
                        "--disable-pip-version-check", "-c", str(ROOT / "constraints.txt"),
                        *requirements], check=True)
        files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
        made = {"requirements": list(requirements), "seconds": round(time.perf_counter() - start, 1),
                "bytes": sum(p.stat().st_size for p in files)}
        (folder / _DONE).write_text(json.dumps(made), encoding="utf-8")
        return python


def made(python: Path) -> dict:
    """What making the environment of ``python`` took: its pins, seconds and bytes."""
    return json.loads((python.parent.parent / _DONE).read_text(encoding="utf-8"))


if __name__ == "__main__":  # python -m testbed.client_env: make guidellm's, say what it took
    print(json.dumps(made(client_env("guidellm", GUIDELLM))))
