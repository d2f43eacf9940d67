"""``python -m transformer_kit``: runs the installed ``transformer-kit`` command.

The command is an application on top of the core, so the core does not import it: it looks up
the console script that this distribution declares and runs it.
"""

from __future__ import annotations

import sys
from importlib import metadata


def main() -> None:
    scripts = metadata.entry_points(group="console_scripts", name="transformer-kit")
    if not scripts:
        sys.exit("transformer-kit is not installed in this environment; install it with "
                 "pip install transformer-kit (or pip install -e . in a checkout).")
    next(iter(scripts)).load()()


if __name__ == "__main__":
    main()
