"""``transformer-kit serve``: an exported decoder behind an OpenAI-compatible HTTP server, with
continuous batching, in this process (FastAPI + uvicorn; no other service); an exported
sentence-embedding model on /v1/embeddings, a cross-encoder on /v1/rerank, batched across
clients."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from transformer_kit.apps.commands import _options as opts
from transformer_kit.apps.exporting import served_folder
from transformer_kit.apps.serving.guard import API_KEY_ENV
from transformer_kit.apps.sources import Provider, open_export, split_adapters
from transformer_kit.apps.terminal import console, fail
from transformer_kit.checkpoints.hub import is_hub_name
from transformer_kit.core.errors import TransformerKitError
from transformer_kit.core.speech.audio import MAX_SECONDS
from transformer_kit.runtime.adapters import adapter_names

_Opt = typer.Option
#: --max-request-seconds by default: the openai client's own default timeout, so a request that
#: runs longer has lost a client with default settings anyway (a stream keeps its client, and is
#: bounded the same, so that no request holds a batch row for ever).
DEFAULT_MAX_REQUEST_SECONDS = 600.0
#: --prefix-cache-bytes by default, 256 MiB: a 500-token prefix's cache is 23 MB for SmolLM2-135M
#: in float32 and 66 MB for an 8B Llama in float16, so a few system prompts or conversations stay,
#: at a small part of the memory of the model itself.
DEFAULT_PREFIX_CACHE_BYTES = 256 * 2**20
#: --drain-seconds by default: how long a server told to stop (SIGTERM) finishes the requests it
#: holds; Kubernetes' grace period before SIGKILL is 30 s.
DEFAULT_DRAIN_SECONDS = 25.0


def serve(
    source: Annotated[Path, typer.Argument(help="A decoder, a sentence-embedding model or a "
                                           "cross-encoder. " + opts.SERVED_SOURCE)],
    host: Annotated[str, _Opt(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, _Opt(help="TCP port.")] = 8000,
    model_name: Annotated[str | None, _Opt(help="The model name clients send (default: a Hub name "
                                           "as given, else the folder's name).")] = None,
    revision: opts.RevisionOption = None,
    quantize: opts.ServedQuantize = None,
    adapter: Annotated[list[str] | None, _Opt(help="NAME=DIR (repeatable): a PEFT LoRA adapter folder exported beside a checkpoint SOURCE and served as the model MODEL_NAME:NAME (an export's own adapters are served so without the flag).")] = None,
    max_batch: Annotated[int, _Opt(help="Most requests decoded together (a decoder's).")] = 16,
    max_queue: Annotated[int, _Opt(help="Most requests waiting; beyond it the server answers "
                                   "503.")] = 64,
    batch_tokens: Annotated[int, _Opt(help="Embeddings and rerank: most padded tokens in one run "
                                      "of the model (requests run together up to it).")] = 8192,
    provider: Annotated[Provider, _Opt(help="Where onnxruntime runs.")] = Provider.auto,
    ray: Annotated[bool, _Opt("--ray", help="Serve on Ray Serve: the Ray cluster RAY_ADDRESS names "
                              "(every node's proxy takes requests, on --port), else a new local Ray "
                              "instance (needs the serve-ray extra).")] = False,
    replicas: Annotated[int, _Opt(help="With --ray: replicas, each with its own engine.")] = 1,
    api_key: Annotated[str | None, _Opt(envvar=API_KEY_ENV, show_envvar=True, help="Every endpoint "
                                        "but /health needs 'Authorization: Bearer KEY' (the openai "
                                        "client's api_key); 401 otherwise.")] = None,
    max_body_mb: Annotated[float | None, _Opt(help="Largest request body taken, in MiB; larger ones "
                                              "get 413. Default: 4, a speech model's 25 (OpenAI's "
                                              "bound on an audio file).")] = None,
    max_audio_seconds: Annotated[float, _Opt(help="A speech model: most seconds of audio in one "
                                             "file; longer ones get 400.")] = MAX_SECONDS,
    max_prompt_tokens: Annotated[int | None, _Opt(help="Most tokens in a completion's prompt or a "
                                             "chat's rendered conversation; longer ones get 400 "
                                             "(context_length_exceeded). Default: the model's "
                                             "context length, else 4096.")] = None,
    max_request_seconds: Annotated[float, _Opt(help="Most seconds a completion or chat may take from "
                                               "arrival to its last token; past it the request is "
                                               "stopped, its batch row freed, and the client gets 504 "
                                               "(a stream: an error event). Default: 600, the openai "
                                               "client's own timeout.")] = DEFAULT_MAX_REQUEST_SECONDS,
    prefix_cache_bytes: Annotated[int, _Opt(help="A decoder's prefix cache: most bytes of prompts' "
                                            "key/value caches kept, so that prompts starting with "
                                            "the same tokens (a system prompt, a chat's history) "
                                            "prefill only the rest; least recently used out first. "
                                            "0: off. Default: 256 MiB.")] = DEFAULT_PREFIX_CACHE_BYTES,
    max_cache_bytes: Annotated[int | None, _Opt(
        min=1, help="A decoder's running batch: most bytes its key/value cache may come to hold, "
        "each request counted at its prompt and max_tokens; requests wait for room, and one that "
        "alone needs more gets 400. Default: a quarter of this machine's memory.")] = None,
    prompt_lookup_num_tokens: Annotated[int | None, _Opt(
        min=1, max=64, help="A decoder's prompt lookup (speculative decoding, docs/serving.md) for "
        "every request that sets no prompt_lookup_num_tokens of its own: at most this many tokens "
        "drafted from the prompt and the reply so far, checked while a request decodes alone; "
        "the tokens are those of plain decoding. Default: off (requests ask).")] = None,
    stored_responses: Annotated[int, _Opt(
        min=0, help="POST /v1/responses: how many responses (store=true) are kept, in memory, so "
        "that previous_response_id can continue them; least recently used out first, lost on "
        "restart. 0: none. Default: 256.")] = 256,
    generation_config: opts.GenerationConfigMode = opts.GenerationMode.auto,
    batch_invariant: Annotated[bool, _Opt(
        "--batch-invariant/--no-batch-invariant",
        help="A decoder's greedy tokens the same whoever else is asking (docs/export.md, \"Batch "
        "invariance\"): prompts of one length prefilled together, a row joining the batch every "
        "16th step. --no-batch-invariant: prompts left-padded into one prefill, rows joining at "
        "the next step.")] = True,
    drain_seconds: Annotated[float, _Opt(help="On SIGTERM the server answers new requests 503 and "
                                         "finishes those it holds, for at most this many seconds, "
                                         "then exits 0.")] = DEFAULT_DRAIN_SECONDS,
) -> None:
    """Serve completions in the OpenAI convention (POST /v1/completions, GET /v1/models,
    /health, /metrics) until interrupted; an embedding model's export on POST /v1/embeddings,
    a cross-encoder's on POST /v1/rerank."""
    _check_bounds(max_body_mb, max_prompt_tokens, max_request_seconds, prefix_cache_bytes, api_key,
                  max_audio_seconds)
    if api_key is None and not _loopback(host):
        console.print(f"[yellow]warning:[/] listening on {host}, beyond this machine, without an API "
                      f"key: anyone who can reach port {port} can use the model. Give --api-key (or "
                      f"{API_KEY_ENV}).")
    max_body_bytes = None if max_body_mb is None else int(max_body_mb * 2**20)
    try:
        folder = served_folder(source, revision, quantize, _named_adapters(adapter or []))
    except TransformerKitError as exc:
        fail(exc)
    name = model_name or (str(source) if is_hub_name(source) else folder.resolve().name)
    if ray:
        _serve_on_ray(folder, name, host, port, replicas, max_batch, max_queue, provider,
                      api_key=api_key, max_body_bytes=max_body_bytes,
                      max_prompt_tokens=max_prompt_tokens, max_request_seconds=max_request_seconds,
                      prefix_cache_bytes=prefix_cache_bytes,
                      prompt_lookup_num_tokens=prompt_lookup_num_tokens,
                      max_audio_seconds=max_audio_seconds)
        return
    try:
        import uvicorn  # noqa: F401 (the serve extra is installed)

        from transformer_kit.apps.serving.http import create_app
        from transformer_kit.runtime import Engine
    except ImportError as exc:
        raise typer.BadParameter(f"serving needs the serve extra ({exc.name} is missing): pip install "
                                 "'transformer-kit[serve]'.") from None
    if batch_tokens < 1:
        raise typer.BadParameter(f"must be at least 1, got {batch_tokens}.", param_hint="--batch-tokens")
    try:
        engine = Engine(open_export(folder, provider, batch_invariant), max_batch=max_batch, max_queue=max_queue,
                        max_batch_tokens=batch_tokens, prefix_cache_bytes=prefix_cache_bytes,
                        prompt_lookup_num_tokens=prompt_lookup_num_tokens, max_cache_bytes=max_cache_bytes)
        adapters = {each: Engine(engine.model, max_batch=max_batch, max_queue=max_queue,
                                 prefix_cache_bytes=prefix_cache_bytes,
                                 prompt_lookup_num_tokens=prompt_lookup_num_tokens, adapter=each,
                                 max_cache_bytes=max_cache_bytes)
                    for each in adapter_names(folder)}
    except TransformerKitError as exc:
        fail(exc)
    if adapters:
        console.print(f"adapters: {', '.join(f'{name}:{each}' for each in adapters)}", highlight=False)
    console.print(f"serving {name!r} from {folder} on http://{host}:{port}/v1 "
                  f"(provider {engine.model.provider}, {_batching(engine, batch_tokens, max_prompt_tokens, max_request_seconds, prefix_cache_bytes, prompt_lookup_num_tokens)}, "
                  f"queue <= {max_queue})")
    if engine.kind == "generate":
        console.print(f"chat page: http://{host}:{port}/")
    try:
        app = create_app(engine, name, api_key=api_key, max_body_bytes=max_body_bytes,
                         max_prompt_tokens=max_prompt_tokens, max_request_seconds=max_request_seconds,
                         stored_responses=stored_responses, adapters=adapters,
                         generation_config=generation_config.value, max_audio_seconds=max_audio_seconds)
        _run_until_stopped(app, host, port, drain_seconds, generation_config.value)
    finally:
        for each in (engine, *adapters.values()):
            each.close()


def _run_until_stopped(app: Any, host: str, port: int, drain_seconds: float, mode: str) -> None:
    """Say what sampling a request gets, then serve ``app`` until Ctrl-C or SIGTERM (drained)."""
    import uvicorn

    if app.state.server.service.kind == "generate":
        console.print(_sampling_defaults(app.state.server.service.generation_defaults, mode),
                      highlight=False)
    server = DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=5),
                            app.state.admission, drain_seconds)
    server.run()
    if server.drained is False:
        console.print(f"[yellow]warning:[/] requests were still running after {drain_seconds:g} s "
                      "(--drain-seconds); they were stopped.")


def _sampling_defaults(defaults: dict[str, Any], mode: str) -> str:
    """What a request that sets no sampling fields gets, in a line."""
    if mode == "ignore":
        return "sampling: OpenAI's defaults (--generation-config ignore)"
    if not defaults:
        return "sampling: OpenAI's defaults (the checkpoint sets none)"
    shown = ", ".join(f"{k} {v}" for k, v in defaults.items())
    return f"sampling defaults from the checkpoint's generation_config.json: {shown}"


class DrainingServer:
    """uvicorn's server, stopping as a server in a fleet should on SIGTERM: new requests get 503
    (``admission`` closed), those in flight finish (at most ``drain_seconds``), then it exits
    normally (status 0; uvicorn alone would raise SIGTERM again once stopped). Ctrl-C stops it
    as uvicorn does. ``drained``: None until a SIGTERM, then whether every request finished."""

    def __init__(self, config: Any, admission: Any, drain_seconds: float) -> None:
        import uvicorn

        outer = self

        class _Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                if sig == signal.SIGTERM:
                    outer.drain()
                else:
                    super().handle_exit(sig, frame)

        self.server = _Server(config)
        self.admission, self.drain_seconds = admission, drain_seconds
        self.drained: bool | None = None

    def drain(self) -> None:
        """Close the door, then stop the server once the requests in flight ended (a thread: a
        signal handler must not wait)."""
        if self.admission.closed:
            return
        self.admission.close()

        def stop_when_drained() -> None:
            self.drained = self.admission.drained(self.drain_seconds)
            self.server.should_exit = True

        threading.Thread(target=stop_when_drained, daemon=True).start()

    def run(self) -> None:
        self.server.run()


def _named_adapters(values: list[str]) -> dict[str, Path]:
    """--adapter NAME=DIR values (a plain DIR, which would be merged, refused)."""
    merged, apart = split_adapters(values)
    if merged is not None:
        raise typer.BadParameter(f"{merged} names no adapter; serve adapters as NAME=DIR (or export "
                                 "the merged model first: transformer-kit export SRC --adapter DIR).",
                                 param_hint="--adapter")
    return apart


def _batching(engine: Any, batch_tokens: int, max_prompt_tokens: int | None,
              max_request_seconds: float, prefix_cache_bytes: int,
              prompt_lookup_num_tokens: int | None) -> str:
    """How the engine batches and bounds requests, in a few words."""
    from transformer_kit.runtime import Limits

    if engine.kind != "generate":
        return f"{engine.kind} on POST /v1/{engine.kind}, runs <= {batch_tokens} tokens"
    limits = Limits.of(engine.model.context_length, max_prompt_tokens)
    cache = f"{prefix_cache_bytes / 2**20:g} MiB" if prefix_cache_bytes else "off"
    lookup = f", prompt lookup <= {prompt_lookup_num_tokens} tokens" if prompt_lookup_num_tokens else ""
    return (f"batch <= {engine.generation.max_batch}, prompts <= {limits.max_prompt_tokens} tokens, "
            f"requests <= {max_request_seconds:g} s, prefix cache {cache}{lookup}")


def _check_bounds(max_body_mb: float | None, max_prompt_tokens: int | None, max_request_seconds: float,
                  prefix_cache_bytes: int, api_key: str | None, max_audio_seconds: float) -> None:
    """typer's BadParameter, naming the option, for a bound or key that cannot be."""
    checks = [(max_body_mb is None or max_body_mb > 0, "--max-body-mb",
               f"must be more than 0, got {max_body_mb}."),
              (max_audio_seconds > 0, "--max-audio-seconds",
               f"must be more than 0, got {max_audio_seconds}."),
              (max_prompt_tokens is None or max_prompt_tokens >= 1, "--max-prompt-tokens",
               f"must be at least 1, got {max_prompt_tokens}."),
              (max_request_seconds > 0, "--max-request-seconds",
               f"must be more than 0, got {max_request_seconds}."),
              (prefix_cache_bytes >= 0, "--prefix-cache-bytes",
               f"must be at least 0 (0: no prefix cache), got {prefix_cache_bytes}."),
              (api_key is None or bool(api_key.strip()), "--api-key",
               f"is empty; give a key, or leave out --api-key and {API_KEY_ENV}.")]
    for ok, option, message in checks:
        if not ok:
            raise typer.BadParameter(message, param_hint=option)


def _loopback(host: str) -> bool:
    """Whether ``host`` listens on this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _serve_on_ray(folder: Path, name: str, host: str, port: int, replicas: int, max_batch: int,
                  max_queue: int, provider: Provider, *, api_key: str | None,
                  max_body_bytes: int | None, max_prompt_tokens: int | None,
                  max_request_seconds: float, prefix_cache_bytes: int = 0,
                  prompt_lookup_num_tokens: int | None = None,
                  max_audio_seconds: float = MAX_SECONDS) -> None:
    """The export of ``folder`` on Ray Serve, ``replicas`` replicas behind Ray's proxy on
    ``host:port``, each with the key and the bounds the one-process server has: on the Ray
    cluster ``RAY_ADDRESS`` names, with a proxy on every node that has a replica (an address of
    one machine becomes every interface, :func:`.proxy_host`), else on a new local instance."""
    if adapter_names(folder):
        raise typer.BadParameter("--ray serves the base model only; serve its adapters without --ray.",
                                 param_hint="--ray")
    try:
        import ray
        from ray import serve

        from transformer_kit.apps.serving.ray_serve import application, connect, proxy_host
        from transformer_kit.runtime import model_kind
    except ImportError as exc:
        raise typer.BadParameter(f"--ray needs the serve-ray extra ({exc.name} is missing): pip install "
                                 "'transformer-kit[serve-ray]'.", param_hint="--ray") from None
    if replicas < 1:
        raise typer.BadParameter(f"must be at least 1, got {replicas}.", param_hint="--replicas")
    try:
        model = open_export(folder, provider)  # refused here, with a sentence, before Ray starts
    except TransformerKitError as exc:
        fail(exc)
    try:
        model_kind(model)  # an encoder that serves nothing is refused here, with a sentence
    except TransformerKitError as exc:
        fail(exc)
    cluster = connect()  # RAY_ADDRESS's cluster, else a new local instance
    # Ray's core worker takes SIGTERM for a crash: it aborts the process (status 134) without
    # serve.shutdown(), which left the replicas running on a cluster whose node was unreachable;
    # here SIGTERM stops the server as Ctrl-C does, replicas and all
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        bind = proxy_host(host, cluster)
        if bind != host:
            console.print(f"on a Ray cluster every node's proxy listens on {bind}, port {port} (Ray "
                          f"Serve gives them all one address, and {host} is one machine's)")
        serve.start(http_options={"host": bind, "port": port})
        serve.run(application(folder, name, replicas=replicas, max_batch=max_batch, max_queue=max_queue,
                              providers=provider.value, api_key=api_key, max_body_bytes=max_body_bytes,
                              max_prompt_tokens=max_prompt_tokens,
                              max_request_seconds=max_request_seconds,
                              prefix_cache_bytes=prefix_cache_bytes,
                              prompt_lookup_num_tokens=prompt_lookup_num_tokens,
                              max_audio_seconds=max_audio_seconds),
                  name="transformer-kit", route_prefix="/")
        where = f" and port {port} of every node with a replica" if cluster else ""
        console.print(f"serving {name!r} on Ray Serve at http://{host}:{port}/v1{where} ({replicas} "
                      "replicas); Ctrl-C or SIGTERM stops it")
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def register(app: typer.Typer) -> None:
    app.command()(serve)
