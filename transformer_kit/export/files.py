"""File modes of what an export writes: like any file the user writes, they follow the umask
(the staging folder is created private by ``tempfile.mkdtemp``, 0700, and so are some files the
exporter writes through temporary files)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

_umask_lock = threading.Lock()


def current_umask() -> int:
    """The process umask (read by setting and restoring it, under a lock)."""
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def follow_umask(folder: Path) -> None:
    """Give ``folder``, its sub-folders (0777) and its files (0666) the modes the umask allows."""
    mask = current_umask()
    folder.chmod(0o777 & ~mask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)
