"""``transformer-kit triton``: a Triton Inference Server model repository from an export folder
(the forward graph on the onnxruntime backend; generation, embeddings or rerank on the Python
backend, over the kit's engine and within the server's limits)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer

from transformer_kit.apps.serving.guard import API_KEY_ENV, DEFAULT_MAX_BODY_BYTES
from transformer_kit.apps.sources import kind_of
from transformer_kit.apps.terminal import console, fail
from transformer_kit.core.errors import ArtifactError, TransformerKitError

_Opt = typer.Option


def triton(
    folder: Annotated[Path, typer.Argument(help="An export folder.")],
    output: Annotated[Path, _Opt("--output", "-o", help="The model repository (made if missing).")],
    name: Annotated[str | None, _Opt(help="Model name prefix (default: the folder's name).")] = None,
    max_batch: Annotated[int, _Opt(help="max_batch_size of the forward model, and most requests "
                                   "the generate model decodes together.")] = 16,
    env: Annotated[Path | None, _Opt(help="The Python environment the generate model runs in "
                                     "(EXECUTION_ENV_PATH: a virtual environment's folder or a "
                                     "conda-pack .tar.gz, with transformer-kit installed); "
                                     "absent: the server's own Python.")] = None,
    max_prompt_tokens: Annotated[int | None, _Opt(help="Most tokens in a prompt (a chat's rendered "
                                             "conversation); longer ones get an error. Default: the "
                                             "model's context length, else 4096.")] = None,
    max_request_seconds: Annotated[float | None, _Opt(help="Most seconds a request may take from "
                                                      "arrival to its end; past it it is stopped with "
                                                      "an error. Default: 600, as transformer-kit "
                                                      "serve.")] = 600.0,
    max_body_mb: Annotated[float, _Opt(help="Largest request taken, in MiB, as serve's body bound: "
                                       "the served model refuses a request whose inputs are larger "
                                       "(HTTP and gRPC), and the printed --http-max-input-size makes "
                                       "Triton refuse a larger HTTP request before parsing it "
                                       "(Triton 25.06 and later).")] = DEFAULT_MAX_BODY_BYTES / 2**20,
    api_key: Annotated[str | None, _Opt(envvar=API_KEY_ENV, show_envvar=True, help="Print the "
                                        "tritonserver flags that make inference need "
                                        "'Authorization: Bearer KEY', as serve --api-key does "
                                        "(the key is never written into the repository).")] = None,
) -> None:
    """Write {name}_forward (onnxruntime backend, dynamic batching) and the model of what the
    export serves, {name}_generate, {name}_embed or {name}_rerank (Python backend, decoupled),
    into a Triton model repository."""
    from transformer_kit.apps.serving.triton import (
        HTTP_MAX_INPUT_SIZE_SINCE,
        body_flags,
        key_flags,
        write_repository,
    )

    try:
        max_body_bytes = int(max_body_mb * 2**20)
        flags = "" if api_key is None else " " + shlex.join(key_flags(api_key))  # refused first
        body = shlex.join(body_flags(max_body_bytes))
        if kind_of(folder) != "export":
            raise ArtifactError(f"{folder} is not an export folder (no manifest.json written by "
                                f"transformer-kit export); export a model first: transformer-kit "
                                f"export SRC -o DIR.")
        written = write_repository(folder, output, name or folder.resolve().name, max_batch, env,
                                   max_prompt_tokens=max_prompt_tokens,
                                   max_request_seconds=max_request_seconds,
                                   max_body_bytes=max_body_bytes)
    except TransformerKitError as exc:
        fail(exc)
    for config in written:
        console.print(f"wrote {config.parent}")
    console.print(f"start Triton with: tritonserver --model-repository {output}{flags} (the forward "
                  "model needs Triton's onnxruntime backend; without it add --model-control-mode "
                  f"explicit --load-model {written[-1].parent.name})", highlight=False, markup=False)
    console.print(f"on Triton {HTTP_MAX_INPUT_SIZE_SINCE} or later also add {body}: Triton then "
                  "refuses a larger HTTP request before parsing it (earlier releases refuse the "
                  "flag; the served model refuses larger inputs on every release)",
                  highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command()(triton)
