"""``transformer-kit bench``: greedy generation speed in onnxruntime against PyTorch eager (and,
for a checkpoint, transformers and optimum), timed in the same interleaved rounds, with the
share of the memory-bandwidth bound at batch 1."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from transformer_kit.apps.sources import REVISION_HELP, Provider, load_model, open_export, resolve_source
from transformer_kit.apps.terminal import console, fail
from transformer_kit.core.errors import InputError, TransformerKitError

if TYPE_CHECKING:  # imported on use: the command line starts without torch
    import torch

    from transformer_kit.apps.benchmark import Runner


def bench(
    source: Annotated[Path, typer.Argument(help="Config file, saved model folder, (with --from-hf) a checkpoint folder, or a checkpoint's Hub name (org/name).")],
    from_hf: Annotated[bool, typer.Option("--from-hf", help="SOURCE is a Hugging Face checkpoint; also time transformers and optimum where installed.")] = False,
    revision: Annotated[str | None, typer.Option(help=REVISION_HELP)] = None,
    batch: Annotated[int, typer.Option(min=1, help="Rows.")] = 1,
    prompt_len: Annotated[int, typer.Option(min=1, help="Prompt (or source) tokens per row.")] = 16,
    new_tokens: Annotated[int, typer.Option(min=1, help="Tokens to generate per row.")] = 32,
    rounds: Annotated[int, typer.Option("--rounds", "--repeats", min=1, help="Timed rounds; each runner once per round, interleaved (medians reported).")] = 5,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Export folder to reuse or create.")] = None,
) -> None:
    """Greedy generation speed against PyTorch eager, timed in the same rounds.

    onnxruntime against PyTorch eager (the baseline), plus transformers and optimum for a
    checkpoint where installed, with the share of the memory-bandwidth bound at batch 1.
    """
    import tempfile

    import torch

    from transformer_kit.apps import benchmark as b
    from transformer_kit.export import export_onnx

    try:
        source, from_hf = resolve_source(source, revision, from_hf)
        model = load_model(source, from_hf=from_hf)
        if model.architecture == "encoder":
            raise InputError(f"{str(source)!r} is an encoder-only model; bench times generation, "
                             "which needs a decoder (benchmarks/forward.py times encoders).")
        workdir = Path(tempfile.mkdtemp(prefix="tk-bench-"))
        folder = output or workdir / "onnx"
        if not (folder / "manifest.json").exists():
            with console.status("exporting ..."):
                export_onnx(model, folder)
        om = open_export(folder, Provider.auto)
        cfg = model.config
        ids = b.random_prompts(cfg.src_vocab, batch, prompt_len,
                               {i for i in (cfg.pad_id, cfg.bos_id, *cfg.eos_ids) if i is not None})
        runners = b.kit_generation_runners(model, om, ids, new_tokens)
        if from_hf and model.architecture == "decoder":
            runners += hf_generation_runners(source, workdir, ids, new_tokens)
        probes = {"bandwidth": b.read_bandwidth_probe()} if batch == 1 else {}
        with console.status("timing ...") as status:
            timings, values = b.interleaved(runners, rounds, probes, progress=status.update)
    except TransformerKitError as exc:
        fail(exc)
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
            shares = [weight_bytes * t.tokens / s / bw
                      for s, bw in zip(t.seconds, values["bandwidth"], strict=True)]
            row.append(f"{statistics.median(shares):.0%}")
        table.add_row(*row)
    console.print(table)
    if probes:
        bandwidth = statistics.median(values["bandwidth"])
        console.print(f"weights read per token {weight_bytes / 1e6:.1f} MB; measured read bandwidth "
                      f"{bandwidth / 1e9:.1f} GB/s; bound {bandwidth / weight_bytes:.0f} tokens/s")


def hf_generation_runners(checkpoint: Path, workdir: Path, ids: torch.Tensor, new_tokens: int,
                          with_transformers: bool = True) -> list[Runner]:
    """transformers in PyTorch and optimum's ORTModelForCausalLM on the same checkpoint, where
    installed; both forced to exactly ``new_tokens`` greedy tokens. Missing ones are skipped."""
    import torch

    from transformer_kit.apps.benchmark import Runner

    runners = []
    kwargs = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False,
              "attention_mask": torch.ones_like(ids)}
    try:
        import transformers
    except ImportError:
        return runners
    if with_transformers:
        hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()

        def hf_eager():
            with torch.inference_mode():
                return hf.generate(ids, pad_token_id=0, **kwargs)[:, ids.shape[1]:]

        runners.append(Runner(f"transformers {transformers.__version__}, PyTorch eager", hf_eager,
                              lambda out: int(out.numel())))
    optimum = load_optimum_causal_lm(checkpoint, workdir)
    if optimum is not None:
        def ort_optimum():
            return optimum.generate(ids, pad_token_id=0, **kwargs)[:, ids.shape[1]:]

        runners.append(Runner(f"{optimum_version()}, onnxruntime", ort_optimum,
                              lambda out: int(out.numel()), note="ORTModelForCausalLM, IO binding"))
    return runners


def optimum_version() -> str:
    """optimum-onnx's version (where optimum's ONNX Runtime models live since optimum 2)."""
    from importlib import metadata

    try:
        return f"optimum-onnx {metadata.version('optimum-onnx')}"
    except metadata.PackageNotFoundError:
        return f"optimum {metadata.version('optimum')}"


def load_optimum_causal_lm(checkpoint: Path, workdir: Path):
    """optimum's ORTModelForCausalLM for ``checkpoint`` (exported once into ``workdir``), or
    None when optimum is not installed."""
    try:
        from optimum.onnxruntime import ORTModelForCausalLM
    except ImportError:
        return None
    folder = workdir / "optimum-causal-lm"
    if not (folder / "model.onnx").exists():
        ORTModelForCausalLM.from_pretrained(checkpoint, export=True, use_cache=True).save_pretrained(folder)
    return ORTModelForCausalLM.from_pretrained(folder, use_io_binding=True)


def register(app: typer.Typer) -> None:
    app.command()(bench)
