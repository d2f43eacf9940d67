"""An environment made of a requirement's dependency closure, taken from this one.

:func:`closure` walks the installed distributions a requirement names (its extras and markers
evaluated as pip evaluates them) and theirs, recursively; :func:`make_env` makes a virtual
environment holding exactly those distributions, their files linked from this environment's
site-packages (seconds, offline), so what is not in the closure (torch, for the base install) is
not there to import. The test of an install without torch runs the server in one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def _holds(requirement: Requirement, extra: str) -> bool:
    """Whether ``requirement``'s marker holds here with ``extra`` asked for."""
    marker = requirement.marker
    return marker is None or marker.evaluate({**default_environment(), "extra": extra})


def closure(requirements: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions ``requirements`` need, by canonical name (each requirement's
    extras followed; a requirement not installed here raises ``PackageNotFoundError``)."""
    found: dict[str, metadata.Distribution] = {}
    pending = [(Requirement(r), "") for r in requirements]
    done: set[tuple[str, frozenset[str]]] = set()
    while pending:
        requirement, extra = pending.pop()
        if not _holds(requirement, extra):
            continue
        name = canonicalize_name(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in done:
            continue
        done.add(key)
        dist = found.get(name) or metadata.distribution(name)
        found[name] = dist
        for line in dist.requires or []:
            needed = Requirement(line)
            wanted = next((e for e in ("", *requirement.extras) if _holds(needed, e)), None)
            if wanted is not None:
                pending.append((needed, wanted))
    return found


def size(dists: dict[str, metadata.Distribution]) -> int:
    """Bytes of the distributions' installed files."""
    total = 0
    for dist in dists.values():
        for file in dist.files or []:
            path = Path(dist.locate_file(file))
            if path.is_file():
                total += path.stat().st_size
    return total


def make_env(folder: Path, requirements: list[str]) -> Path:
    """A virtual environment in ``folder`` with the closure of ``requirements`` linked in; its
    Python interpreter."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.run([str(python), "-c", where], check=True, capture_output=True,
                               text=True).stdout.strip())
    here = Path(sysconfig.get_paths()["purelib"]).resolve()
    for dist in closure(requirements).values():
        for file in dist.files or []:
            source = Path(dist.locate_file(file)).resolve()
            if not source.is_file() or not source.is_relative_to(here):
                continue  # scripts in bin/, files outside site-packages
            target = site / source.relative_to(here)
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                os.symlink(source, target)
    return python
