"""``transformer-kit serve``: an exported decoder behind an OpenAI-compatible HTTP server, with
continuous batching, in this process (FastAPI + uvicorn; no other service)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from transformer_kit.apps.sources import Provider, open_export
from transformer_kit.apps.terminal import console, fail
from transformer_kit.errors import TransformerKitError

_Opt = typer.Option


def serve(
    folder: Annotated[Path, typer.Argument(help="An export folder of a decoder.")],
    host: Annotated[str, _Opt(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, _Opt(help="TCP port.")] = 8000,
    model_name: Annotated[str | None, _Opt(help="The model name clients send (default: the "
                                           "folder's name).")] = None,
    max_batch: Annotated[int, _Opt(help="Most requests decoded together.")] = 16,
    max_queue: Annotated[int, _Opt(help="Most requests waiting; beyond it the server answers "
                                   "503.")] = 64,
    provider: Annotated[Provider, _Opt(help="Where onnxruntime runs.")] = Provider.auto,
) -> None:
    """Serve completions in the OpenAI convention (POST /v1/completions, GET /v1/models,
    /health, /metrics) until interrupted."""
    try:
        import uvicorn

        from transformer_kit.apps.serving.engine import Engine
        from transformer_kit.apps.serving.http import create_app
    except ImportError as exc:
        raise typer.BadParameter(f"serving needs the serve extra ({exc.name} is missing): pip install "
                                 "'transformer-kit[serve]'.") from None
    try:
        engine = Engine(open_export(folder, provider), max_batch=max_batch, max_queue=max_queue)
    except TransformerKitError as exc:
        fail(exc)
    name = model_name or folder.resolve().name
    console.print(f"serving {name!r} from {folder} on http://{host}:{port}/v1 "
                  f"(provider {engine.model.provider}, batch <= {max_batch}, queue <= {max_queue})")
    try:
        uvicorn.run(create_app(engine, name), host=host, port=port, log_level="warning")
    finally:
        engine.close()


def register(app: typer.Typer) -> None:
    app.command()(serve)
