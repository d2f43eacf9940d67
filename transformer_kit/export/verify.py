"""Verification of an export: onnxruntime against PyTorch on fresh inputs with padding."""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from transformer_kit.checkpoints.streaming import weights_per_module
from transformer_kit.core.decoding.prompts import left_align, real_from_pad
from transformer_kit.core.errors import ExportError
from transformer_kit.core.model import TransformerModel
from transformer_kit.export.weight_writer import WeightSource
from transformer_kit.runtime.onnx_model import SHARED_STEP, OnnxModel
from transformer_kit.runtime.step_graph import LAST_POSITION, LOGIT_POSITIONS

#: Shapes (batch, length) of the forward graph checked after every export.
VERIFY_SHAPES = ((3, 7), (1, 4))
#: Prompts' length in the step, sentence-output and generation checks (more or less by a few).
PROMPT_LEN = 5
#: Random prompts (count, length) of a quantized export's top-1 agreement: 256 positions, less
#: the padding (a standard error of 0.3 points at 99.7 %, 1.9 at 90 %; each position costs a
#: forward token in PyTorch float32 and in onnxruntime).
TOP1_PROMPTS = (16, 16)


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """max |actual - expected| / max |expected|: the error relative to the output's scale."""
    expected = np.asarray(expected, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    if not np.isfinite(actual).all():
        return float("inf")
    scale = max(float(np.abs(expected).max()), 1e-12)
    return float(np.abs(actual - expected).max()) / scale


def random_ids(batch: int, length: int, vocab: int, pad_id: int | None, seed: int,
               pad_rows: bool = True) -> torch.Tensor:
    """Token ids avoiding pad_id, with right padding in every other row when pad_rows."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length), generator=gen)
    if pad_id is not None:
        ids[ids == pad_id] = (pad_id + 1) % vocab
        if pad_rows:
            for row in range(1, batch, 2):
                ids[row, max(1, length - 1 - row):] = pad_id
    return ids


def random_features(model: TransformerModel, batch: int, length: int, seed: int) -> torch.Tensor:
    """Features (batch, channels, frames) for a frontend whose output is ``length`` long: a
    log-mel spectrogram of random samples where the model has a features component (its range),
    else normal values."""
    frontend = model.src_embed.frontend
    frames = length * getattr(frontend, "stride", 1)
    gen = torch.Generator().manual_seed(seed)
    features = model.src_embed.features
    if features is None:
        return torch.randn(batch, frontend.in_channels, frames, generator=gen)
    samples = torch.randn(batch, frames * features.hop_length, generator=gen) * 0.1
    with torch.no_grad():
        return features(samples)


def random_source(model: TransformerModel, batch: int, length: int, seed: int) -> torch.Tensor:
    """An encoder-decoder's source: token ids with padding, or a frontend's features."""
    cfg = model.config
    if model.takes_features:
        return random_features(model, batch, length, seed)
    return random_ids(batch, length, cfg.src_vocab, cfg.pad_id, seed)


def _forward_inputs(model: TransformerModel, batch: int, length: int, seed: int):
    cfg = model.config
    if model.architecture == "encoder_decoder":
        return (random_source(model, batch, length, seed),
                random_ids(batch, max(1, length - 2), cfg.tgt_vocab, cfg.pad_id, seed + 1, False))
    return (random_ids(batch, length, cfg.vocab_size, cfg.pad_id, seed),)


def _fit(length: int, model: TransformerModel, room: int = 0) -> int:
    """``length`` capped so that ``length + room`` positions fit the model's context (its
    positional encoding's bound, else its ``max_len``, as generation enforces it; at least 1)."""
    return max(1, min(length, model.context_length - room))


@torch.no_grad()
def check_forward(model: TransformerModel, om: OnnxModel, batch: int, length: int,
                  seed: int = 0) -> float:
    """Relative error of ``om(...)`` against ``model(...)`` at one shape (shortened to fit
    the model's positions)."""
    inputs = _forward_inputs(model, batch, _fit(length, model), seed)
    if getattr(model, "classifier", None) is not None:  # the graph's first output: its logits
        expected = model.classify(*inputs)[0].float().numpy()
    else:
        expected = model(*inputs).float().numpy()
    return relative_error(om(*[x.numpy() for x in inputs]), expected)


@torch.no_grad()
def check_sentence_outputs(model: TransformerModel, om: OnnxModel, seed: int = 0) -> float:
    """Relative error of the sentence embedding (or the classifier's scores) on a padded
    batch, each row's pooled positions (or token types) varied, against PyTorch."""
    length = _fit(PROMPT_LEN + 3, model)
    ids = random_ids(3, length, model.config.vocab_size, model.config.pad_id, seed)
    pad = model.config.pad_id
    real = (ids != pad) if pad is not None else torch.ones_like(ids, dtype=torch.bool)
    extra = torch.zeros_like(ids)
    for row in range(len(ids)):
        extra[row, row:] = 1  # pooled from position `row` on; or the second segment from it
    inputs = om.manifest.graphs["model"].inputs
    if model.sentence_head is not None and "pooling_mask" not in inputs:
        extra = torch.ones_like(ids)  # the graph pools every real token
    types = extra if "token_type_ids" in inputs else None  # else one segment
    if model.sentence_head is not None:
        expected = model.sentence_embedding(ids, real.long(), extra).float().numpy()
        actual = om.run_embedding(ids.numpy(), real.numpy(), extra.numpy())
    else:
        expected = model.classify(ids, real.long(), types)[1].float().numpy()
        actual = om.run_scores(ids.numpy(), real.numpy(), extra.numpy())
    return relative_error(actual, expected)


@torch.no_grad()
def check_decoder_step(model: TransformerModel, om: OnnxModel, seed: int = 0) -> float:
    """Relative error of the step graph (prompt, then one more token) against PyTorch."""
    cfg = model.config
    session = om.session("decoder_step")
    graph = om.manifest.graphs["decoder_step"]
    layers = om.manifest.num_decoder_layers
    batch = 3
    empty = [np.zeros((batch, cfg.kv_heads, 0, cfg.attention_head_dim), om.cache_dtype)] * (2 * layers)
    caches = model.new_cache(batch, torch.empty(0))  # float32 on the CPU, as the reference
    errors = []
    if model.architecture == "decoder":
        prompts = random_ids(batch, _fit(PROMPT_LEN + 2, model, room=4), cfg.vocab_size, cfg.pad_id,
                             seed).numpy()
        ids, real = left_align(prompts, real_from_pad(prompts, cfg.pad_id))
        mask = real.astype(np.int64)
        fixed: dict[str, np.ndarray] = {}

        def reference(new_ids: np.ndarray, mask: np.ndarray, every: bool) -> torch.Tensor:
            if every:  # every new position's logits, as speculative decoding asks
                logits = model.step(torch.from_numpy(new_ids), torch.from_numpy(mask) != 0, caches,
                                    positions=torch.arange(new_ids.shape[1]))
                return logits.reshape(-1, logits.shape[-1])
            return model.step(torch.from_numpy(new_ids), torch.from_numpy(mask) != 0, caches,
                              last_only=True)[:, -1]
    else:
        src = random_source(model, batch, _fit(PROMPT_LEN + 2, model), seed)
        if model.takes_features:
            feeds = {"input_features": src.numpy()}
        else:
            src_mask = real_from_pad(src.numpy(), cfg.pad_id).astype(np.int64)
            feeds = {"src_ids": src.numpy(), "attention_mask": src_mask}
        encoded = om.session("encoder").run(None, feeds)
        fixed = dict(zip(om.manifest.graphs["encoder"].outputs, encoded, strict=True))
        memory, src_real = model.encode(src)
        start = cfg.bos_id if cfg.bos_id is not None else 0  # any token checks the graph
        ids = np.full((batch, 1), start, np.int64)
        mask = np.ones((batch, 1), np.int64) if "attention_mask" in graph.inputs else None

        def reference(new_ids: np.ndarray, mask: np.ndarray | None, every: bool) -> torch.Tensor:
            return model.decode(torch.from_numpy(new_ids), memory, src_real, caches,
                                last_only=True)[:, -1]
    past = empty
    # the prompt, one token, then three tokens with every new position's logits (a decoder's)
    widths = [1, 1, 3] if LOGIT_POSITIONS in graph.inputs else [1, 1]
    for step, width in enumerate(widths):  # logits of the last position, or of ``width`` ones
        feeds = {"input_ids": ids, **fixed, **dict(zip(
            [n for n in graph.inputs if n.startswith("past_key_values.")], past, strict=True))}
        if mask is not None:
            feeds["attention_mask"] = mask
        feeds[LOGIT_POSITIONS] = np.arange(width) if width > 1 else LAST_POSITION
        feeds = {k: v for k, v in feeds.items() if k in graph.inputs}
        logits, *past = session.run(None, feeds)
        expected = reference(ids, mask, width > 1)
        errors.append(relative_error(logits, expected.float().numpy()))
        present = [t for c in caches for t in (c.key, c.value)]
        # a padding column of the cache is never read (the step graph leaves it unlike PyTorch's)
        real = 1.0 if mask is None else mask[:, None, :, None]
        errors.extend(relative_error(a * real, e.float().numpy() * real)
                      for a, e in zip(past, present, strict=True))
        if step + 1 < len(widths):  # the chosen token, then random ones (drafted tokens)
            following = widths[step + 1]
            drafted = random_ids(batch, following - 1, cfg.tgt_vocab, None, seed + step).numpy()
            ids = np.concatenate([expected.argmax(-1, keepdim=True).numpy(), drafted], axis=1)
            if mask is not None:
                mask = np.concatenate([mask, np.ones((batch, following), np.int64)], axis=1)
    return max(errors)


@torch.no_grad()
def check_features_graph(model: TransformerModel, om: OnnxModel, seed: int = 0) -> float:
    """Relative error of the features graph (a raw signal to the encoder's features) against
    PyTorch's, on two rows of random samples of a length that is not a whole number of hops."""
    features = model.src_embed.features
    gen = torch.Generator().manual_seed(seed)
    samples = torch.randn(2, 37 * features.hop_length + 11, generator=gen) * 0.1
    samples[1, : features.hop_length * 5] = 0.0  # a silent start: the clamp below the maximum
    return relative_error(om.audio_features(samples.numpy()), features(samples).numpy())


@torch.no_grad()
def check_alignment_graph(model: TransformerModel, om: OnnxModel, seed: int = 0) -> float:
    """Relative error of the alignment graph (the alignment heads' cross-attention
    probabilities, teacher-forced) against ``cross_attention_weights``, on two rows of random
    features and target tokens."""
    cfg = model.config
    features = random_source(model, 2, PROMPT_LEN, seed)
    tokens = random_ids(2, 5, cfg.tgt_vocab, cfg.pad_id, seed + 1, pad_rows=False)
    memory, real = model.encode(features)
    expected = model.cross_attention_weights(memory, real, tokens, cfg.speech.alignment_heads)
    return relative_error(om.alignment_weights(features.numpy(), tokens.numpy()), expected.numpy())


@torch.no_grad()
def check_shared_step(model: TransformerModel, om: OnnxModel, seed: int = 0) -> float:
    """Relative error of the step graph over shared cache buffers against PyTorch's forward:
    three prompts of different lengths prefilled and joined, two steps of the three rows, then
    three tokens of the first row in one run (``verify``, where the graph gives them)."""
    layout = om.cache_layout(fewest_rows=1)
    cfg, errors = model.config, []

    def ids(length: int, offset: int) -> np.ndarray:
        return random_ids(1, length, cfg.vocab_size, cfg.pad_id, seed + offset, pad_rows=False)[0].numpy()

    def expected(row: np.ndarray, count: int = 1) -> np.ndarray:
        return model(torch.from_numpy(row[None]))[0, -count:].float().numpy()

    rows = [ids(_fit(n, model, room=6), i) for i, n in enumerate((PROMPT_LEN, 3, 8))]
    for row in rows:
        prefilled, logits = layout.prefill([row])
        layout.join(prefilled)
        errors.append(relative_error(logits[0], expected(row)[0]))
    for step in range(2):
        tokens = ids(len(rows), 10 + step)
        logits = layout.step(tokens)
        rows = [np.append(row, token) for row, token in zip(rows, tokens, strict=True)]
        errors.extend(relative_error(logits[i], expected(row)[0]) for i, row in enumerate(rows))
    if layout.verifies:
        layout.keep(np.array([0]))
        drafted = ids(3, 20)
        logits = layout.verify(drafted)
        errors.append(relative_error(logits, expected(np.concatenate([rows[0], drafted]), 3)))
    return max(errors)


@torch.no_grad()
def top1_agreement(model: TransformerModel, om: OnnxModel, prompts: int = TOP1_PROMPTS[0],
                   length: int = TOP1_PROMPTS[1], seed: int = 11) -> float | None:
    """Share of positions of random prompts (prompts, length) whose most likely token in ``om``
    equals PyTorch's; None for a model without an output head."""
    if "logits" not in om.manifest.graphs["model"].outputs:
        return None
    inputs = _forward_inputs(model, prompts, _fit(length, model), seed)
    expected = model(*inputs).argmax(-1).numpy()
    actual = om(*[x.numpy() for x in inputs]).argmax(-1)
    real = real_from_pad(inputs[-1].numpy(), model.config.pad_id)  # target or decoder positions
    return float((actual == expected)[real].mean())


def in_memory_float32(model: TransformerModel) -> bool:
    """Whether ``model`` runs as it is for the reference: float32 weights in memory."""
    return model.streamed_weights is None and all(
        p.dtype == torch.float32 for p in model.parameters())


def reference(model: TransformerModel, source: WeightSource) -> contextlib.AbstractContextManager:
    """While active, ``model`` computes PyTorch's float32 reference: as it is when its weights
    are float32 in memory, else with each layer's weights read (from ``source``) and turned to
    float32 as it runs (a streamed or bfloat16 model)."""
    if in_memory_float32(model):
        return contextlib.nullcontext()
    return weights_per_module(model, source.load, torch.float32)


def describe_reference(model: TransformerModel) -> str:
    """How :func:`reference` computes, for the report."""
    if in_memory_float32(model):
        return "PyTorch float32, in memory"
    return "PyTorch float32, each layer's weights read as it runs"


@torch.no_grad()
def float32_spread(model: TransformerModel, source: WeightSource) -> float:
    """PyTorch's own float32 rounding on the verification's inputs: the largest relative error
    of the float32 reference against float64 (weights read layer by layer: no float64 copy of
    the model), over :data:`VERIFY_SHAPES`.

    onnxruntime rounds in float32 too, in another order, so a correct export differs from
    PyTorch by about this much; models whose scores are not scaled (T5) or are deep spread
    more, and by how much depends on the CPU's kernels."""
    inputs = [_forward_inputs(model, batch, _fit(length, model), seed)
              for seed, (batch, length) in enumerate(VERIFY_SHAPES)]
    with weights_per_module(model, source.load, torch.float64):
        exact = [model(*[t.double() if t.is_floating_point() else t for t in x]).numpy()
                 for x in inputs]
    with reference(model, source):
        return max(relative_error(model(*x).numpy(), e) for x, e in zip(inputs, exact, strict=True))


def verify_export(model: TransformerModel, om: OnnxModel, tolerance: float | None) -> dict:
    """Check every graph against PyTorch; raise :class:`ExportError` above ``tolerance``.

    Returns ``{"errors": {graph or shape: relative error}, "tokens_match": bool | None}``.
    """
    errors = {f"model {b}x{n}": check_forward(model, om, b, n, seed=i)
              for i, (b, n) in enumerate(VERIFY_SHAPES)}
    tokens_match = None
    if getattr(model, "sentence_head", None) is not None or getattr(model, "classifier", None) is not None:
        errors["sentence outputs"] = check_sentence_outputs(model, om)
    if "features" in om.manifest.graphs:
        errors["features"] = check_features_graph(model, om)
    if "decoder_step" in om.manifest.graphs:
        errors["decoder_step"] = check_decoder_step(model, om)
    if "alignment" in om.manifest.graphs:
        errors["alignment"] = check_alignment_graph(model, om)
    if SHARED_STEP in om.manifest.graphs:
        shared = om if om.step_name == SHARED_STEP else OnnxModel(om.path, providers="cpu",
                                                                  cache_layout="shared_buffer")
        errors[SHARED_STEP] = check_shared_step(model, shared)
    generates = model.architecture == "decoder" or (
        model.architecture == "encoder_decoder" and model.config.bos_id is not None)
    if generates:
        cfg = model.config
        vocab = cfg.src_vocab if model.architecture == "encoder_decoder" else cfg.vocab_size
        steps = max(0, min(4, model.context_length - 1))
        room = 0 if model.architecture == "encoder_decoder" else steps
        length = _fit(PROMPT_LEN + 1, model, room=room)
        prompts = (random_source(model, 3, length, seed=7) if model.architecture == "encoder_decoder"
                   else random_ids(3, length, vocab, cfg.pad_id, seed=7))
        tokens_match = bool(np.array_equal(om.generate(prompts.numpy(), steps),
                                           model.generate(prompts, steps).numpy()))
    worst = max(errors.values())
    if tolerance is not None and not worst <= tolerance:
        detail = ", ".join(f"{k}: {v:.3g}" for k, v in errors.items())
        raise ExportError(
            f"The exported graphs do not match PyTorch: relative error {worst:.3g} is above the "
            f"tolerance {tolerance:g} ({detail}). A component's ONNX translation is likely wrong; "
            "check plugins that supply transformer_kit_onnx_translations."
        )
    agreement = top1_agreement(model, om) if om.manifest.quantization else None
    return {"errors": errors, "tokens_match": tokens_match, "top1_agreement": agreement}
