"""``transformer-kit export``: a model (config file, saved folder, Hugging Face checkpoint, GGUF
file, or a Hub name of either) to a verified ONNX export folder; prints the verification report."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from transformer_kit.apps.commands._options import Quantization
from transformer_kit.apps.exporting import export_with_progress
from transformer_kit.apps.sources import (
    REVISION_HELP,
    kind_of,
    load_model,
    special_id_overrides,
    split_adapters,
)
from transformer_kit.apps.terminal import console, fail, settings, warn
from transformer_kit.core.errors import InputError, TransformerKitError

SPECIAL_ID_HELP = "Override the model's {} (a token id, or 'none'), e.g. for a checkpoint whose config.json has none."


class Dtype(str, Enum):
    float32 = "float32"
    float16 = "float16"


INT4_OPTIONS = ("--block-size", "--accuracy-level", "--symmetric/--asymmetric", "--float-head",
                "--float-embedding", "--rounding", "--eight-bit", "--calibration")


def export(
    source: Annotated[Path, typer.Argument(help="Config file, saved model folder, GGUF file, checkpoint folder with --from-hf, or a Hub name: org/name (a checkpoint), org/name:FILE.gguf.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Export folder (new, empty, or an earlier export to replace).")],
    weights: Annotated[Path | None, typer.Option(help="safetensors weights for a config file.")] = None,
    from_hf: Annotated[bool, typer.Option("--from-hf", help="SOURCE is a Hugging Face checkpoint folder.")] = False,
    revision: Annotated[str | None, typer.Option(help=REVISION_HELP)] = None,
    adapter: Annotated[list[str] | None, typer.Option(help="A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors): DIR is merged into the checkpoint SOURCE's weights; NAME=DIR (repeatable) is exported beside them, chosen per call (OnnxModel.generate(..., adapter=NAME)).")] = None,
    dtype: Annotated[Dtype, typer.Option(help="Weights and activations.")] = Dtype.float32,
    quantize: Annotated[Quantization | None, typer.Option(help="int8: dynamic int8 quantization of the matrix products; int4: 4-bit MatMulNBits weights.")] = None,
    block_size: Annotated[int | None, typer.Option(help="int4: weights per scale, 16..256, a power of 2 (default 32).")] = None,
    accuracy_level: Annotated[int | None, typer.Option(help="int4: compute type on the CPU, 4 = int8 (default), 1 = float32, 0 = the kernel's default.")] = None,
    symmetric: Annotated[bool | None, typer.Option("--symmetric/--asymmetric", help="int4: a scale per block (zero point 8, the default), or a scale and a zero point.")] = None,
    float_head: Annotated[bool, typer.Option("--float-head", help="int4: keep the output head in float32.")] = False,
    float_embedding: Annotated[bool, typer.Option("--float-embedding", help="int4: keep the token embedding in float32 (else 4-bit, shared with a tied head).")] = False,
    rounding: Annotated[str | None, typer.Option(help="int4: each block's scale: 'search' (least squared error, the default) or 'nearest' (onnxruntime's round to nearest).")] = None,
    eight_bit: Annotated[str | None, typer.Option("--eight-bit", help="int4: weights kept in 8 bits, comma-separated roles among embedding, head, value, down, early (the first eighth of the layers), or 'none' (default: embedding,early).")] = None,
    calibration: Annotated[str | None, typer.Option(help="int4: a UTF-8 text file whose inputs weigh each column's rounding error, 'default' (the kit's own text) or 'none'.")] = None,
    opset: Annotated[int | None, typer.Option(min=18, max=23, help="ONNX opset, 18..23 (default 23).")] = None,
    optimize: Annotated[bool, typer.Option(help="Measure and keep onnxruntime's offline optimizations.")] = False,
    verify: Annotated[bool, typer.Option("--verify/--no-verify", help="Check the graphs against PyTorch (the default; each layer's weights read as it runs for a checkpoint).")] = True,
    pad_id: Annotated[str | None, typer.Option("--pad-id", help=SPECIAL_ID_HELP.format("padding id"))] = None,
    bos_id: Annotated[str | None, typer.Option("--bos-id", help=SPECIAL_ID_HELP.format("start id"))] = None,
    eos_id: Annotated[str | None, typer.Option("--eos-id", help=SPECIAL_ID_HELP.format("end id"))] = None,
) -> None:
    """Export a model to ONNX, verified against PyTorch, and print the report."""
    from transformer_kit.export.quantize import Int4

    overrides = special_id_overrides(pad_id, bos_id, eos_id)
    merged, apart = split_adapters(adapter or [])
    if apart:
        overrides["adapters"] = apart
    if quantize is Quantization.int8 and dtype is not Dtype.float32:
        raise typer.BadParameter("--quantize int8 starts from float32 weights; leave out --dtype "
                                 "(int4 takes --dtype float16).", param_hint="--quantize")
    given = [name for name, value in zip(INT4_OPTIONS, (block_size, accuracy_level, symmetric,
                                                       float_head or None, float_embedding or None,
                                                       rounding, eight_bit, calibration),
                                         strict=True) if value is not None]
    if given and quantize is not Quantization.int4:
        raise typer.BadParameter(f"{', '.join(given)} set int4 quantization; add --quantize int4.",
                                 param_hint=given[0])
    method = quantize.value if quantize else None
    if quantize is Quantization.int4:
        try:
            chosen = {key: value for key, value in (("rounding", rounding), ("symmetric", symmetric))
                      if value is not None}
            if eight_bit is not None:
                roles = [r.strip() for r in eight_bit.split(",") if r.strip()]
                chosen["eight_bit"] = () if roles == ["none"] else tuple(roles)
            if calibration is not None:
                chosen["calibration"] = {"none": None, "default": "default"}.get(calibration, Path(calibration))
            method = Int4(block_size=32 if block_size is None else block_size,
                          accuracy_level=4 if accuracy_level is None else accuracy_level,
                          head=not float_head, embedding=not float_embedding,
                          **chosen)
        except InputError as exc:
            flag = next((f for f, key in (("--calibration", "calibration"), ("--block-size", "block_size"),
                                          ("--rounding", "rounding"), ("--eight-bit", "eight_bit"))
                         if key in str(exc)),
                        "--accuracy-level")
            raise typer.BadParameter(str(exc), param_hint=flag) from None
    try:
        model = load_model(source, from_hf=from_hf, weights=weights, overrides=overrides, stream=True,
                           revision=revision, adapter=merged)
        if kind_of(source) == "config file" and weights is None:
            warn(f"{source} is a config file and no --weights were given: the export holds "
                 "randomly initialised weights. Pass --weights FILE.safetensors, or export a folder "
                 "saved with model.save.")
        report = export_with_progress(model, output, dtype=dtype.value, quantize=method, opset=opset,
                                      optimize=optimize, verify=verify)
    except TransformerKitError as exc:
        fail(exc)
    console.print(str(report), highlight=False)
    settings["exit_without_teardown"] = True  # the folder is complete and every file closed


def register(app: typer.Typer) -> None:
    app.command()(export)
