"""How much memory this machine has available for new weights (no psutil dependency)."""

from __future__ import annotations

import os
from pathlib import Path


def available_memory() -> int | None:
    """Bytes of memory available to allocate without swapping (Linux ``MemAvailable``, else the
    free physical pages), or None where neither can be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
