"""``export_onnx``: any assembled model to a self-describing folder of ONNX graphs, verified."""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from transformer_kit.core.errors import ExportError, InputError, TransformerKitError
from transformer_kit.core.model import TransformerModel
from transformer_kit.core.registry import get_registry
from transformer_kit.export import kit_lowerings, model_graphs
from transformer_kit.export.adapters import add_adapters
from transformer_kit.export.calibration import calibrate, calibration_for
from transformer_kit.export.files import follow_umask
from transformer_kit.export.gguf_blocks import FileBlocks
from transformer_kit.export.graph_builder import FLOAT, FLOAT16, GraphBuilder
from transformer_kit.export.graph_passes import finish
from transformer_kit.export.kept_weights import reference_source
from transformer_kit.export.memory_estimate import refuse_if_too_large
from transformer_kit.export.quantize import Int4, method, quantization, quantize_graph
from transformer_kit.export.quantized_experts import expert_bits
from transformer_kit.export.report import ExportReport, versions
from transformer_kit.export.traced_components import ComponentTracer
from transformer_kit.export.translations import collect_translations
from transformer_kit.export.weight_writer import WeightSource, WeightWriter, weight_source
from transformer_kit.export.weights import WEIGHTS_FILE, share_weights
from transformer_kit.runtime.manifest import MANIFEST_FILE, GraphInfo, Manifest

DEFAULT_OPSET = 23  # ONNX's Attention and RotaryEmbedding ops
MIN_OPSET = 18  # the oldest opset the lowerings write
TOLERANCES = {"float32": 1e-4, "float16": 2e-2}
#: The default float32 tolerance is at least this many times PyTorch's own float32 spread on the
#: verification's inputs (against float64): onnxruntime's error and PyTorch's each reach about
#: that spread, in other directions, so 2x is their sum and 4x leaves room for other CPUs'
#: reduction orders. A wrong lowering errs by 1e-2 and more, far above either.
SPREAD_FACTOR = 4
DTYPES = ("float32", "float16")
_EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf files stop at 2 GB


def _file_bytes(folder: Path, graphs: dict[str, GraphInfo]) -> dict[str, int]:
    """Bytes of each graph file and of the weights they share."""
    sizes = {name: (folder / g.file).stat().st_size for name, g in graphs.items()}
    sizes[WEIGHTS_FILE] = (folder / WEIGHTS_FILE).stat().st_size if (folder / WEIGHTS_FILE).exists() else 0
    return sizes


def tensor_bytes(model: torch.nn.Module, dtype: str = "float32") -> int:
    """Bytes of the model's distinct parameters and buffers (a tied weight counts once) in the
    export's ``dtype`` (floating ones), on any device (``meta`` included)."""
    size = torch.finfo(getattr(torch, dtype)).bits // 8
    return sum(t.numel() * (size if t.dtype.is_floating_point else t.element_size())
               for t in [*model.parameters(), *model.buffers()])


def _check_arguments(model: Any, opset: int, dtype: str, quantize: str | Int4 | None) -> None:
    if not isinstance(model, TransformerModel):
        raise InputError(f"export_onnx takes a model from transformer_kit.build_model, got "
                         f"{type(model).__name__}.")
    if dtype not in DTYPES:
        raise InputError(f"dtype={dtype!r} is not supported; choose one of {', '.join(DTYPES)}.")
    if quantize == "int8" and dtype != "float32":
        raise InputError("int8 quantization starts from a float32 export; use dtype='float32' "
                         "(int4 takes float16 too).")
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= DEFAULT_OPSET:
        raise InputError(f"opset={opset!r} is not supported; choose {MIN_OPSET}..{DEFAULT_OPSET} "
                         f"(default {DEFAULT_OPSET}).")
    if model.unexportable:
        advice = " ".join(model.unexportable_reasons) or "Build the model with another component."
        raise ExportError(f"This model cannot be exported to ONNX: {', '.join(model.unexportable)} "
                          f"declares itself not exportable. {advice}")


def _prepare_folder(out_dir: Path) -> Path:
    if out_dir.exists() and (not out_dir.is_dir() or (
            any(out_dir.iterdir()) and not (out_dir / MANIFEST_FILE).exists())):
        raise ExportError(
            f"{str(out_dir)!r} exists and is not an earlier export (no {MANIFEST_FILE}); "
            "choose an empty or new folder so nothing of yours is overwritten."
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))


def _publish(staging: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` by the finished export (its modes following the umask, as any folder
    the user writes); the old one is removed only afterwards."""
    follow_umask(staging)
    old = None
    if out_dir.exists():
        old = out_dir.with_name(f".{out_dir.name}.old-{time.time_ns()}")
        out_dir.rename(old)
    staging.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _build_and_write(model: TransformerModel, dtype: str, writer: WeightWriter, staging: Path,
                     opset: int, tracer: ComponentTracer,
                     report_progress: Callable[[str, int, int], None]) -> dict[str, GraphInfo]:
    """Build each graph from the model's lowerings and write it with its weights."""
    float_type = FLOAT16 if dtype == "float16" else FLOAT
    registry = get_registry()

    def builder(name: str) -> GraphBuilder:
        return GraphBuilder(model, name, float_type=float_type, opset=opset, registry=registry,
                            fallback=tracer.call, core=kit_lowerings.find)

    graphs: dict[str, GraphInfo] = {}
    for name in model_graphs.graph_names(model, opset):
        report_progress(f"building {name}", 0, 1)
        built = model_graphs.build_graph(name, model, builder)
        finish(built.model)
        file = f"{name}.onnx"
        writer.write(built.model, "", staging / file,
                     functools.partial(report_progress, f"writing the weights of {name}"))
        graphs[name] = GraphInfo(file, built.inputs, built.outputs)
    order = ["model", "features", "encoder", "decoder_step", "decoder_step_shared", "alignment"]
    return {name: graphs[name] for name in sorted(graphs, key=order.index)}


def export_onnx(model: TransformerModel, out_dir: str | Path, *, opset: int | None = None,
                dtype: str = "float32", verify: bool = True, quantize: str | Int4 | None = None,
                optimize: bool = False, tolerance: float | None = None,
                progress: Callable[[str, int, int], None] | None = None) -> ExportReport:
    """Export ``model`` to ONNX in ``out_dir`` and (by default) verify it against PyTorch.

    Args:
        model: from :func:`transformer_kit.build_model` (or ``load_model``), any architecture.
        out_dir: a new or empty folder, or an earlier export to replace. Written to a temporary
            folder first and moved into place only when complete.
        opset: ONNX opset, 18..23 (default 23).
        dtype: ``"float32"`` or ``"float16"`` (weights and activations in half precision; with
            int4, the activations and the blocks' scales, the GPU's usual 4-bit form).
        verify: run onnxruntime against PyTorch on fresh inputs with padding and raise
            :class:`ExportError` above ``tolerance`` (relative; default in float32 1e-4 or
            4x PyTorch's own float32 spread against float64 on the same inputs, whichever is
            larger; 2e-2 in float16; int8 and int4 errors are reported, not enforced).
        quantize: ``"int8"`` for dynamic int8 quantization of the weights (CPU serving);
            ``"int4"`` (or :class:`Int4` with a block size, accuracy level, symmetry and whether
            to quantize the output head) for 4-bit ``MatMulNBits`` weights.
        optimize: also apply onnxruntime's offline graph optimizations; the report gives the
            measured latency with and without, and the optimized graphs are kept only when they
            verify and are faster.
        progress: called as ``progress(step, done, total)`` while the export works (the
            command line draws it as a progress bar): each graph built, each weight written,
            then verification.
    Returns:
        an :class:`ExportReport` with the measured errors, the sizes and the times.
    """
    opset = DEFAULT_OPSET if opset is None else opset
    quantize = calibration_for(model, quantization(quantize))
    _check_arguments(model, opset, dtype, quantize)
    adapters = model.adapters
    if adapters and model.architecture != "decoder":
        raise ExportError(f"Adapters kept apart (from_hf(..., adapters=...)) export for decoders; this "
                          f"model is an {model.architecture}. Merge the adapter instead "
                          "(from_hf(..., adapter=DIR)).")
    if adapters and (quantize is not None or dtype != "float32" or optimize):
        raise ExportError("A model with adapters kept apart (from_hf(..., adapters=...)) exports in "
                          "float32 without quantize or optimize; merge an adapter instead "
                          "(from_hf(..., adapter=DIR)) to quantize it.")
    refuse_if_too_large(model, quantize, dtype, verify)
    out_dir = Path(out_dir)
    start = time.perf_counter()
    staging = _prepare_folder(out_dir)
    was_training = model.training
    try:
        tracer = ComponentTracer(opset, collect_translations())
        weight_bytes = tensor_bytes(model, dtype)
        source = weight_source(model)
        file_blocks = FileBlocks(model) if isinstance(quantize, Int4) else None
        report_progress = progress or (lambda step, done, total: None)
        graphs = _write_graphs(model, staging, dtype, opset, quantize, source, tracer, file_blocks,
                               weight_bytes, report_progress)
        manifest = _manifest(model, staging, dtype, opset, quantize, graphs)
        manifest.write(staging)
        export_seconds = time.perf_counter() - start
        report = ExportReport(out_dir, model.architecture, opset, dtype, method(quantize),
                              _file_bytes(staging, graphs), export_seconds=export_seconds,
                              weight_bytes=weight_bytes, traced_components=dict(tracer.traced),
                              weight_origins=dict(file_blocks.origins) if file_blocks else {})
        model.eval()
        if verify or optimize:
            source = reference_source(source, model, quantize, dtype)
        if verify:
            _verify(model, staging, source, dtype, quantize, tolerance, manifest, report,
                    report_progress)
        if optimize:
            _optimize(model, staging, source, manifest, report, graphs)
        if adapters:
            sizes = {name: tuple(p.shape) for name, p in model.named_parameters()}
            add_adapters(staging, {name: info.file for name, info in manifest.graphs.items()},
                         adapters, sizes)
        manifest.write(staging)
        _publish(staging, out_dir)
    except TransformerKitError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except Exception as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise ExportError(f"Export failed: {type(exc).__name__}: {exc}") from exc
    except BaseException:  # KeyboardInterrupt, SystemExit: leave no half-written folder either
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        model.train(was_training)
    return report


def _write_graphs(model: TransformerModel, staging: Path, dtype: str, opset: int,
                  quantize: str | Int4 | None, source: WeightSource, tracer: ComponentTracer,
                  file_blocks: FileBlocks | None, weight_bytes: int,
                  report_progress: Callable[[str, int, int], None]) -> dict[str, GraphInfo]:
    """The model's graphs built and written into ``staging`` with their weights: int4's
    calibration first, int8's quantization of each written graph after."""
    int4 = quantize if isinstance(quantize, Int4) else None
    # int4's calibration runs before the graphs are written (its memory given back first); for
    # a model with GGUF blocks, when a product first needs it (never, when all take the file's)
    importance = None
    if int4 is not None:
        calibration = functools.partial(calibrate, model, int4, report_progress)
        importance = calibration if file_blocks else calibration()
    writer = WeightWriter(staging, source, int4, file_blocks, importance, expert_bits(quantize))
    graphs = _build_and_write(model, dtype, writer, staging, opset, tracer, report_progress)
    writer.close()
    if quantize == "int8":  # onnxruntime's dynamic quantizer reads each whole graph
        for name, info in graphs.items():
            if name != "features":  # a signal's features stay float32 (their bases are exact)
                quantize_graph(staging / info.file, weight_bytes > _EXTERNAL_DATA_BYTES)
        share_weights(staging, [g.file for g in graphs.values()])
    return graphs


def _manifest(model: TransformerModel, staging: Path, dtype: str, opset: int,
              quantize: str | Int4 | None, graphs: dict[str, GraphInfo]) -> Manifest:
    """The export's manifest (the model's tokenizer files saved into ``staging`` on the way)."""
    cfg = model.config
    return Manifest(
        architecture=model.architecture, config=cfg.to_dict(), dtype=dtype, opset=opset,
        graphs=graphs,
        num_decoder_layers=len(model.decoder.layers) if hasattr(model, "decoder") else 0,
        kv_heads=cfg.kv_heads, head_dim=cfg.attention_head_dim, src_vocab=cfg.src_vocab,
        tgt_vocab=cfg.tgt_vocab, pad_id=cfg.pad_id, bos_id=cfg.bos_id, eos_id=cfg.eos_id,
        max_positions=model.max_positions, quantization=method(quantize),
        quantization_options=quantize.describe() if isinstance(quantize, Int4) else {},
        versions=versions(),
        tokenizer=model.tokenizer.save(staging) if model.tokenizer is not None else [],
        generation_defaults=dict(getattr(model, "generation_defaults", None) or {}),
    )


def _verify(model: TransformerModel, staging: Path, source: Any, dtype: str,
            quantize: str | Int4 | None, tolerance: float | None, manifest: Manifest,
            report: ExportReport, report_progress: Callable[[str, int, int], None]) -> None:
    """Run the export in ``staging`` against PyTorch (weights from ``source``) and record the
    errors in ``report`` and ``manifest``; raises :class:`ExportError` above the tolerance
    (``tolerance``, else the dtype's default widened to PyTorch's own float32 spread; none for a
    quantized export)."""
    from transformer_kit.export.verify import (
        describe_reference,
        float32_spread,
        reference,
        verify_export,
    )
    from transformer_kit.runtime.onnx_model import OnnxModel

    report_progress("verifying against PyTorch", 0, 1)
    verify_start = time.perf_counter()
    report.tolerance = tolerance
    if tolerance is None and not quantize:
        report.tolerance = TOLERANCES[dtype]
        if dtype == "float32":
            report.float32_spread = float32_spread(model, source)
            report.tolerance = max(report.tolerance, SPREAD_FACTOR * report.float32_spread)
    report.reference = describe_reference(model)
    with reference(model, source):
        result = verify_export(model, OnnxModel(staging, providers="auto"), report.tolerance)
    report.errors, report.tokens_match = result["errors"], result["tokens_match"]
    report.top1_agreement = result["top1_agreement"]
    report.verify_seconds = time.perf_counter() - verify_start
    manifest.verification = {"errors": report.errors, "tolerance": report.tolerance,
                             "float32_spread": report.float32_spread,
                             "reference": report.reference,
                             "tokens_match": report.tokens_match,
                             "top1_agreement": report.top1_agreement}


def _optimize(model: TransformerModel, staging: Path, source: Any, manifest: Manifest,
              report: ExportReport, graphs: dict[str, GraphInfo]) -> None:
    """onnxruntime's offline optimizations of the graphs in ``staging``, kept when they verify
    and are faster (:func:`~transformer_kit.export.optimize.optimize_graphs`)."""
    from transformer_kit.export.optimize import optimize_graphs
    from transformer_kit.export.verify import reference

    with reference(model, source):
        report.optimization = optimize_graphs(model, staging, manifest, report.tolerance)
    report.graph_bytes = _file_bytes(staging, graphs)
