"""The ``transformer-kit`` command: components, config, export, run, generate, bench, demo, plot.

Errors print one line (no traceback unless ``--debug``) and exit with status 1; bad usage exits
with status 2, as click does.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from transformer_kit.errors import TransformerKitError

app = typer.Typer(help="Transformer components as plugins: build, export to ONNX, run.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
config_app = typer.Typer(help="Show, validate or describe model configs.", no_args_is_help=True)
plot_app = typer.Typer(help="Heat maps of positional encodings and attention weights.",
                       no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(plot_app, name="plot")
console = Console()
errors = Console(stderr=True)
_state = {"debug": False}


@app.callback()
def _options(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False) -> None:
    _state["debug"] = debug


def _fail(exc: BaseException) -> None:
    if _state["debug"]:
        raise exc
    errors.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
    raise typer.Exit(1)


def _parse_ids(text: str) -> list[list[int]]:
    """'5 6 7; 8 9' -> [[5, 6, 7], [8, 9, 0]]-style rows (padded later with pad_id)."""
    try:
        rows = [[int(t) for t in row.replace(",", " ").split()] for row in text.split(";")]
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not token ids; write e.g. \"5 6 7; 8 9\".") from None
    if not rows or any(not r for r in rows):
        raise typer.BadParameter(f"{text!r} has an empty row; write e.g. \"5 6 7; 8 9\".")
    return rows


def _pad(rows: list[list[int]], pad_id: int | None):
    import numpy as np

    width = max(map(len, rows))
    if pad_id is None and any(len(r) != width for r in rows):
        raise typer.BadParameter("rows of different lengths need a pad_id in the model config.")
    return np.array([r + [pad_id or 0] * (width - len(r)) for r in rows], dtype=np.int64)


def _load_model(source: Path, from_hf: bool, weights: Path | None):
    """A config file, a folder saved with model.save, or (with --from-hf) a checkpoint folder."""
    import transformer_kit as tk

    if from_hf:
        return tk.from_hf(source)
    if source.is_dir():
        return tk.load_model(source)
    model = tk.build_model(source)
    if weights is not None:
        from safetensors.torch import load_model as load_weights

        try:
            load_weights(model, str(weights))
        except Exception as exc:
            raise TransformerKitError(f"Cannot load weights {str(weights)!r} into the model "
                                      f"{str(source)!r} describes: {str(exc).splitlines()[0]}") from None
    return model.eval()


# -- components ----------------------------------------------------------------------------
@app.command()
def components(kind: Annotated[str | None, typer.Option(help="Only this kind.")] = None) -> None:
    """List every registered component with its plugin, distribution and capabilities."""
    from transformer_kit.registry import get_registry

    try:
        registry = get_registry()
        entries = registry.entries(kind)
    except TransformerKitError as exc:
        _fail(exc)
    table = Table(title="transformer_kit components")
    for column in ("kind", "name", "plugin", "distribution", "ONNX", "cache", "description"):
        table.add_column(column)
    for e in entries:
        c = e.component
        table.add_row(c.kind, c.name, e.plugin, e.distribution or "built-in",
                      "yes" if c.exportable else "no", "yes" if c.supports_cache else "no",
                      c.description)
    console.print(table)
    for failure in registry.failures:
        console.print(f"[red]not loaded:[/] plugin {failure.plugin!r} "
                      f"({failure.distribution or 'no distribution'}): {failure.error}")


# -- config --------------------------------------------------------------------------------
def _resolve_config(source: Path):
    from transformer_kit.checkpoints import config_from_hf
    from transformer_kit.config import load_config
    from transformer_kit.errors import ConfigError
    from transformer_kit.jsonfile import read_json_object
    from transformer_kit.serialization import CONFIG_FILE

    if source.is_dir():
        path = source / CONFIG_FILE
        saved = read_json_object(path, ConfigError, "Give a config file, a folder saved with "
                                 "model.save or a checkpoint folder.") if path.exists() else {}
        if saved.get("format") == "transformer_kit":
            return load_config(saved["config"])
        return config_from_hf(source)
    return load_config(source)


@config_app.command("show")
def config_show(source: Annotated[Path, typer.Argument(help="Config file, saved model or HF checkpoint folder.")]) -> None:
    """Print the resolved config (defaults filled in) as YAML."""
    import yaml

    try:
        config = _resolve_config(source)
    except TransformerKitError as exc:
        _fail(exc)
    console.print(yaml.safe_dump(config.to_dict(), sort_keys=False), end="", highlight=False)


@config_app.command("validate")
def config_validate(source: Annotated[Path, typer.Argument(help="Config file to check.")]) -> None:
    """Check a config, its component names and their combination, without building weights."""
    import transformer_kit as tk
    from transformer_kit.assembly import check_capabilities
    from transformer_kit.registry import get_registry

    try:
        config = _resolve_config(source)
        registry = get_registry()
        for kind in tk.KINDS:
            registry.entry(kind, config.component(kind).name)
        check_capabilities(config, registry)
    except TransformerKitError as exc:
        _fail(exc)
    console.print(f"[green]valid:[/] {source} ({config.architecture}, d_model {config.d_model})")


@config_app.command("schema")
def config_schema(output: Annotated[Path | None, typer.Option("-o", "--output", help="Write here instead of stdout.")] = None) -> None:
    """The JSON schema of a config, for editors."""
    from transformer_kit.config import ModelConfig

    text = json.dumps(ModelConfig.model_json_schema(), indent=2)
    if output is None:
        sys.stdout.write(text + "\n")
    else:
        output.write_text(text + "\n")
        console.print(f"wrote {output}")


# -- export / run / generate ---------------------------------------------------------------
@app.command()
def export(
    source: Annotated[Path, typer.Argument(help="Config file, saved model folder, or checkpoint folder with --from-hf.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Export folder.")],
    weights: Annotated[Path | None, typer.Option(help="safetensors weights for a config file.")] = None,
    from_hf: Annotated[bool, typer.Option("--from-hf", help="SOURCE is a Hugging Face checkpoint folder.")] = False,
    dtype: Annotated[str, typer.Option(help="float32 or float16.")] = "float32",
    quantize: Annotated[str | None, typer.Option(help="int8 for dynamic quantization.")] = None,
    opset: Annotated[int | None, typer.Option(help="ONNX opset, 18..23.")] = None,
    optimize: Annotated[bool, typer.Option(help="Measure and keep onnxruntime's offline optimizations.")] = False,
) -> None:
    """Export a model to ONNX, verified against PyTorch, and print the report."""
    from transformer_kit.export import export_onnx

    try:
        model = _load_model(source, from_hf, weights)
        with console.status(f"exporting {model.architecture} to {output} ..."):
            report = export_onnx(model, output, dtype=dtype, quantize=quantize, opset=opset,
                                 optimize=optimize)
    except TransformerKitError as exc:
        _fail(exc)
    console.print(str(report), highlight=False)


def _onnx_model(folder: Path, provider: str):
    from transformer_kit.export import OnnxModel

    return OnnxModel(folder, providers=provider)


@app.command()
def run(
    folder: Annotated[Path, typer.Argument(help="An export folder.")],
    ids: Annotated[str, typer.Option(help='Token ids, rows separated by ";": "5 6 7; 8 9".')],
    tgt_ids: Annotated[str | None, typer.Option(help="Target ids (encoder_decoder).")] = None,
    provider: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
) -> None:
    """Run the exported forward graph; print the output shape and the top token per position."""
    rows = _parse_ids(ids)
    tgt_rows = _parse_ids(tgt_ids) if tgt_ids else None
    try:
        om = _onnx_model(folder, provider)
        pad = om.manifest.pad_id
        inputs = [_pad(rows, pad)]
        if om.manifest.architecture == "encoder_decoder":
            inputs.append(_pad(tgt_rows or [[om.manifest.bos_id]] * len(rows), pad))
        out = om(*inputs)
    except TransformerKitError as exc:
        _fail(exc)
    console.print(f"provider: {om.provider}")
    console.print(f"output {om.manifest.graphs['model'].outputs[0]}: shape {list(out.shape)}, "
                  f"dtype {out.dtype}")
    if om.manifest.graphs["model"].outputs[0] == "logits":
        console.print(f"argmax: {out.argmax(-1).tolist()}")


@app.command()
def generate(
    folder: Annotated[Path, typer.Argument(help="An export folder.")],
    ids: Annotated[str, typer.Option(help='Prompt (or source) ids, rows separated by ";".')],
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate at most.")] = 16,
    provider: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
) -> None:
    """Greedy generation in onnxruntime from the exported decoder step."""
    rows = _parse_ids(ids)
    try:
        om = _onnx_model(folder, provider)
        prompts = _pad(rows, om.manifest.pad_id)
        start = time.perf_counter()
        tokens = om.generate(prompts, max_new_tokens=max_new_tokens)
        elapsed = time.perf_counter() - start
    except TransformerKitError as exc:
        _fail(exc)
    console.print(f"provider: {om.provider}")
    for row in tokens.tolist():
        console.print(" ".join(map(str, row)))
    console.print(f"{tokens.size} tokens in {elapsed * 1e3:.0f} ms ({tokens.size / max(elapsed, 1e-9):.0f} tokens/s)")


# -- bench ---------------------------------------------------------------------------------
@app.command()
def bench(
    source: Annotated[Path, typer.Argument(help="Config file, saved model folder, or (with --from-hf) a checkpoint folder.")],
    from_hf: Annotated[bool, typer.Option("--from-hf", help="SOURCE is a Hugging Face checkpoint; also time transformers and optimum where installed.")] = False,
    batch: Annotated[int, typer.Option(min=1, help="Rows.")] = 1,
    prompt_len: Annotated[int, typer.Option(min=1, help="Prompt (or source) tokens per row.")] = 16,
    new_tokens: Annotated[int, typer.Option(min=1, help="Tokens to generate per row.")] = 32,
    rounds: Annotated[int, typer.Option("--rounds", "--repeats", min=1, help="Timed rounds; each runner once per round, interleaved (medians reported).")] = 5,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Export folder to reuse or create.")] = None,
) -> None:
    """Greedy generation speed against PyTorch eager (the baseline), timed in the same rounds,
    with the share of the memory-bandwidth bound (batch 1)."""
    import statistics
    import tempfile

    import torch

    from transformer_kit import benchmark as b
    from transformer_kit.export import export_onnx

    try:
        model = _load_model(source, from_hf, None)
        if model.architecture == "encoder":
            raise TransformerKitError(f"{str(source)!r} is an encoder-only model; bench times generation, "
                                      "which needs a decoder (see benchmarks/forward.py for encoders).")
        workdir = Path(tempfile.mkdtemp(prefix="tk-bench-"))
        folder = output or workdir / "onnx"
        if not (folder / "manifest.json").exists():
            with console.status("exporting ..."):
                export_onnx(model, folder)
        om = _onnx_model(folder, "auto")
        cfg = model.config
        ids = b.random_prompts(cfg.src_vocab, batch, prompt_len,
                               {i for i in (cfg.pad_id, cfg.bos_id, cfg.eos_id) if i is not None})
        runners = b.kit_generation_runners(model, om, ids, new_tokens)
        if from_hf and model.architecture == "decoder":
            runners += b.hf_generation_runners(source, workdir, ids, new_tokens)
        probes = {"bandwidth": b.read_bandwidth_probe()} if batch == 1 else {}
        with console.status("timing ...") as status:
            timings, values = b.interleaved(runners, rounds, probes, progress=status.update)
    except TransformerKitError as exc:
        _fail(exc)
    table = Table(title=f"greedy generation, batch {batch}, {prompt_len} + {new_tokens} tokens, "
                        f"{torch.get_num_threads()} threads, {rounds} rounds")
    columns = ["runtime", "tokens/s", "ms/token", "vs PyTorch eager"]
    weight_bytes = b.weight_bytes_per_token(model)
    if probes:
        columns.append("share of bandwidth bound")
    for column in columns:
        table.add_column(column)
    for t in timings:
        row = [t.name, f"{t.tokens_per_s:.1f}", f"{1e3 / t.tokens_per_s:.2f}",
               f"{b.ratio_to(timings, timings[0].name, t.name):.2f}x"]
        if probes:
            shares = [weight_bytes * t.tokens / s / bw for s, bw in zip(t.seconds, values["bandwidth"], strict=True)]
            row.append(f"{statistics.median(shares):.0%}")
        table.add_row(*row)
    console.print(table)
    if probes:
        bandwidth = statistics.median(values["bandwidth"])
        console.print(f"weights read per token {weight_bytes / 1e6:.1f} MB; measured read bandwidth "
                      f"{bandwidth / 1e9:.1f} GB/s; bound {bandwidth / weight_bytes:.0f} tokens/s")


# -- demo ----------------------------------------------------------------------------------
@app.command()
def demo(
    output: Annotated[Path, typer.Option("-o", "--output", help="Where the artefacts go.")] = Path("transformer-kit-demo"),
    steps: Annotated[int, typer.Option(help="Training steps at most (stops once solved).")] = 1500,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Train the paper's encoder-decoder to reverse digit strings, export it, compare runtimes."""
    from transformer_kit.demo_run import run_demo

    try:
        code = run_demo(output, steps=steps, seed=seed, console=console)
    except TransformerKitError as exc:
        _fail(exc)
    raise typer.Exit(code)


# -- plot ----------------------------------------------------------------------------------
@plot_app.command("positional")
def plot_positional_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="PNG file.")] = Path("positional.png"),
    name: Annotated[str, typer.Option(help="Positional component.")] = "sinusoidal",
    length: Annotated[int, typer.Option(help="Positions.")] = 50,
    d_model: Annotated[int, typer.Option(help="Dimensions.")] = 128,
) -> None:
    """Heat map of a positional encoding (seed 002 draws the sinusoidal 50 x 128)."""
    from transformer_kit.plotting import plot_positional

    try:
        path = plot_positional(output, name, length, d_model)
    except TransformerKitError as exc:
        _fail(exc)
    console.print(f"wrote {path}")


@plot_app.command("attention")
def plot_attention_cmd(
    source: Annotated[Path, typer.Argument(help="Config file or saved model folder.")],
    ids: Annotated[str, typer.Option(help="Input (or source) ids of one row.")],
    tgt_ids: Annotated[str | None, typer.Option(help="Target ids (encoder_decoder).")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for the PNGs.")] = Path("attention"),
) -> None:
    """Attention weights of every layer and head for one input, one PNG per layer."""
    import torch

    from transformer_kit.plotting import plot_attention

    try:
        model = _load_model(source, False, None)
        inputs: list[Any] = [torch.tensor(_parse_ids(ids)[:1])]
        if model.architecture == "encoder_decoder":
            inputs.append(torch.tensor(_parse_ids(tgt_ids or str(model.config.bos_id))[:1]))
        paths = plot_attention(model, tuple(inputs), output)
    except TransformerKitError as exc:
        _fail(exc)
    for path in paths:
        console.print(f"wrote {path}")


def main() -> None:
    app()
