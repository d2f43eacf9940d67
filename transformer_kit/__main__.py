"""``python -m transformer_kit``: the same as the ``transformer-kit`` command."""

from transformer_kit.cli import main

if __name__ == "__main__":
    main()
