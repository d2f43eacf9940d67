"""One module per ``transformer-kit`` command, each with ``register(app: typer.Typer)``."""
