"""``OnnxModel``: run an exported model in onnxruntime (forward and greedy generation).

Needs numpy and onnxruntime only: not torch, not the plugin that built the model. One
instance may be used from many threads at once (sessions are thread-safe; every call keeps its
own state). On CUDA the key/value cache stays on the device between steps (IO binding); the
same code path runs on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from transformer_kit.errors import ArtifactError, ConfigError, InputError
from transformer_kit.export.manifest import Manifest
from transformer_kit.export.providers import CUDA, resolve_providers
from transformer_kit.id_checks import check_id_array, check_positions

_NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16}
#: onnxruntime optimizers skipped on the CPU by default (see ``OnnxModel``).
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def _as_numpy(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    elif isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise InputError(f"{name} must be a numpy array or torch tensor of token ids, got "
                         f"{type(x).__name__}.")
    return x


def check_ids(x: Any, vocab: int, name: str) -> np.ndarray:
    """(batch, len) integer ids within [0, vocab), as contiguous int64."""
    ids = _as_numpy(x, name)
    check_id_array(name, ids.dtype.kind in "iu", ids.dtype, ids.shape,
                   lambda: (int(ids.min()), int(ids.max())), vocab)
    return np.ascontiguousarray(ids, dtype=np.int64)


def positions_needed(ids: np.ndarray, pad_id: int | None) -> int:
    """Positions the longest row takes: its real tokens (padding gets no position, as in
    PyTorch's positions_from_keep), or the full width when there is no pad_id."""
    return ids.shape[1] if pad_id is None else int((ids != pad_id).sum(axis=1).max())


def left_align(ids: np.ndarray, pad_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Move each row's padding to the left (token order kept); drop all-padding columns.

    Returns ids (batch, len') int64 and attention_mask (batch, len') int64, 1 for real tokens.
    """
    keep = np.ones(ids.shape, dtype=bool) if pad_id is None else ids != pad_id
    order = np.argsort(keep.astype(np.int8), axis=1, kind="stable")
    ids, keep = np.take_along_axis(ids, order, 1), np.take_along_axis(keep, order, 1)
    first = int(keep.any(axis=0).argmax())
    return np.ascontiguousarray(ids[:, first:]), keep[:, first:].astype(np.int64)


def greedy(next_logits: Callable[[np.ndarray | None], np.ndarray], batch: int, max_new_tokens: int,
           eos_id: int | None, fill_id: int) -> np.ndarray:
    """Greedy decoding as :func:`transformer_kit.generation.greedy_loop`, on numpy arrays."""
    if max_new_tokens == 0:
        return np.zeros((batch, 0), dtype=np.int64)
    finished = np.zeros(batch, dtype=bool)
    chosen = []
    logits = next_logits(None)
    for step in range(max_new_tokens):
        token = np.where(finished, fill_id, logits.argmax(axis=-1)).astype(np.int64)
        chosen.append(token)
        if eos_id is not None:
            finished |= token == eos_id
        if step + 1 == max_new_tokens or finished.all():
            break
        logits = next_logits(token)
    return np.stack(chosen, axis=1)


class OnnxModel:
    """An exported model in onnxruntime; mirrors the PyTorch model's forward and generate.

    Args:
        path: the folder ``export_onnx`` wrote.
        providers: ``"auto"`` (CUDA where a CUDA session really works, else CPU), ``"cpu"``,
            ``"cuda"``, or a list of onnxruntime providers (names or (name, options) pairs).
        session_options: an ``onnxruntime.SessionOptions`` used for every graph.
        disabled_optimizers: onnxruntime graph optimizers to skip. ``"auto"`` skips
            ``SkipLayerNormFusion`` on the CPU: onnxruntime's CPU SkipLayerNormalization kernel
            was measured slower than the LayerNormalization and Add it replaces (without the
            fusion a BERT-shaped forward at 4 x 128 ran 5 % faster, GPT-2-shaped decoding 4 %);
            on CUDA the fusion is kept. Pass ``()`` to keep every optimizer.
    """

    def __init__(self, path: str | Path, providers: str | Sequence = "auto", *,
                 session_options: ort.SessionOptions | None = None,
                 disabled_optimizers: str | Sequence[str] = "auto") -> None:
        self.path = Path(path)
        self.manifest = Manifest.read(self.path)
        self._providers = resolve_providers(providers)
        self._options = session_options
        if disabled_optimizers == "auto":
            names = [p[0] if isinstance(p, (tuple, list)) else p for p in self._providers]
            disabled_optimizers = () if CUDA in names else CPU_DISABLED_OPTIMIZERS
        self._disabled_optimizers = list(disabled_optimizers)
        self._sessions = {name: self._load(name) for name in self.manifest.graphs}
        #: The execution provider the sessions really run on.
        self.provider: str = self._sessions["model"].get_providers()[0]
        self._device = "cuda" if self.provider == CUDA else "cpu"
        self._kv_dtype = _NUMPY_DTYPES[self.manifest.dtype]

    def _load(self, name: str) -> ort.InferenceSession:
        graph = self.manifest.graphs[name]
        file = self.path / graph.file
        try:
            session = ort.InferenceSession(str(file), self._options, providers=self._providers,
                                           disabled_optimizers=self._disabled_optimizers or None)
        except Exception as exc:  # onnxruntime raises its own exception types
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ArtifactError(f"onnxruntime cannot load {str(file)!r}: {first}. The file may be "
                              "truncated or corrupt; export the model again.") from None
        inputs = [i.name for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]
        if inputs != graph.inputs or outputs != graph.outputs:
            raise ArtifactError(
                f"{graph.file} does not match the manifest: the graph has inputs {inputs} and "
                f"outputs {outputs}, the manifest lists {graph.inputs} and {graph.outputs}. "
                "Export the model again."
            )
        return session

    # -- forward ---------------------------------------------------------------------------
    def __call__(self, *ids: Any) -> np.ndarray:
        """encoder_decoder: (src_ids, tgt_ids) -> logits; decoder: (input_ids) -> logits;
        encoder: (input_ids) -> hidden states (or logits). Arrays of (batch, len) ids."""
        m = self.manifest
        graph = m.graphs["model"]
        if len(ids) != len(graph.inputs):
            raise InputError(f"This {m.architecture} model takes {len(graph.inputs)} input(s) "
                             f"({', '.join(graph.inputs)}), got {len(ids)}.")
        vocabs = [m.src_vocab, m.tgt_vocab] if m.architecture == "encoder_decoder" else [m.src_vocab]
        feeds = {name: check_ids(x, vocab, name)
                 for name, x, vocab in zip(graph.inputs, ids, vocabs, strict=True)}
        for name, x in feeds.items():  # targets are never padding-masked, so count them in full
            check_positions(positions_needed(x, None if name == "tgt_ids" else m.pad_id),
                            m.max_positions, name)
        if m.architecture == "encoder_decoder" and len(feeds["src_ids"]) != len(feeds["tgt_ids"]):
            raise InputError(f"src_ids has {len(feeds['src_ids'])} rows but tgt_ids has "
                             f"{len(feeds['tgt_ids'])}; give one target row per source row.")
        return self._sessions["model"].run(None, feeds)[0]

    # -- generation ------------------------------------------------------------------------
    def generate(self, ids: Any, max_new_tokens: int = 32) -> np.ndarray:
        """Greedy decoding, token for token as ``model.generate``: (batch, len) prompts
        (decoder, padded with pad_id on either side) or source ids (encoder_decoder, decoded
        from bos_id) -> (batch, steps) int64 new tokens; rows stop at eos_id and are filled
        with pad_id (or eos_id) after it."""
        m = self.manifest
        if "decoder_step" not in m.graphs:
            raise InputError(f"generate needs a decoder; this model's architecture is {m.architecture!r}.")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) \
                or max_new_tokens < 0:
            raise InputError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}.")
        max_new_tokens = int(max_new_tokens)
        name = "input_ids" if m.architecture == "decoder" else "src_ids"
        ids = check_ids(ids, m.src_vocab, name)
        if m.architecture == "decoder":
            ids, mask = left_align(ids, m.pad_id)
            empty = np.flatnonzero(mask.sum(axis=1) == 0).tolist()
            if empty:
                raise InputError(f"Prompt rows {empty} hold only padding (pad_id={m.pad_id}); give "
                                 "every row at least one token.")
            check_positions(positions_needed(ids, m.pad_id) + max_new_tokens, m.max_positions,
                            "prompt + max_new_tokens")
            stepper = _Stepper(self, ids.shape[0], {}, ids, mask, max_new_tokens)
        else:
            if m.bos_id is None:
                raise ConfigError("bos_id is null, but encoder_decoder decoding starts from bos_id; "
                                  "export the model again with a bos_id in its config.")
            check_positions(positions_needed(ids, m.pad_id), m.max_positions, name)
            check_positions(1 + max_new_tokens, m.max_positions, "bos + max_new_tokens")
            first = np.full((len(ids), 1), m.bos_id, np.int64)
            stepper = _Stepper(self, ids.shape[0], self._encode(ids), first, None, max_new_tokens)
        fill = next((i for i in (m.pad_id, m.eos_id) if i is not None), 0)
        return greedy(stepper, ids.shape[0], max_new_tokens, m.eos_id, fill)

    def _encode(self, src_ids: np.ndarray) -> dict[str, Any]:
        """Run the encoder once: encoder_attention_mask and every layer's cross keys/values."""
        session = self._sessions["encoder"]
        io = session.io_binding()
        io.bind_cpu_input("src_ids", src_ids)
        outputs = self.manifest.graphs["encoder"].outputs
        for name in outputs:
            io.bind_output(name, self._device)
        session.run_with_iobinding(io)
        return dict(zip(outputs, io.get_outputs(), strict=True))

    def _empty_cache(self, batch: int) -> ort.OrtValue:
        m = self.manifest
        shape = [batch, m.kv_heads, 0, m.head_dim]
        return ort.OrtValue.ortvalue_from_shape_and_type(shape, self._kv_dtype, self._device, 0)


class _Stepper:
    """Feeds the decoder step graph: the prompt first (zero-length past), then one token at a
    time, handing each step's ``present.*`` to the next as ``past_key_values.*`` without a copy.

    The attention mask lives in one buffer allocated for the whole generation (each step binds
    a longer view of it) and the logits are written into one preallocated array, so a step
    allocates nothing in Python; onnxruntime allocates the presents from its arena.
    """

    def __init__(self, model: OnnxModel, batch: int, fixed: dict[str, Any], first_ids: np.ndarray,
                 attention_mask: np.ndarray | None, max_new_tokens: int = 0) -> None:
        self.model = model
        self.session = model._sessions["decoder_step"]
        graph = model.manifest.graphs["decoder_step"]
        self.past_names = [n for n in graph.inputs if n.startswith("past_key_values.")]
        self.present_names = [n for n in graph.outputs if n.startswith("present.")]
        self.fixed = [(k, v) for k, v in fixed.items() if k in graph.inputs]
        self.past = [model._empty_cache(batch)] * len(self.past_names)
        self.first_ids = first_ids
        self.length = first_ids.shape[1]
        self.mask = None
        if attention_mask is not None:
            # (batch, prompt + steps); batch 1 views are contiguous, wider batches copy a view
            self.mask = np.ones((batch, self.length + max(max_new_tokens, 1)), np.int64)
            self.mask[:, :self.length] = attention_mask
        vocab = model.manifest.tgt_vocab
        self.logits = np.empty((batch, vocab), _NUMPY_DTYPES[model.manifest.dtype])
        self.logits_value = ort.OrtValue.ortvalue_from_numpy(self.logits)

    def __call__(self, token: np.ndarray | None) -> np.ndarray:
        io = self.session.io_binding()
        if token is None:
            io.bind_cpu_input("input_ids", self.first_ids)
        else:
            io.bind_cpu_input("input_ids", np.ascontiguousarray(token[:, None]))
            self.length += 1
        if self.mask is not None:
            io.bind_cpu_input("attention_mask", np.ascontiguousarray(self.mask[:, :self.length]))
        for name, value in self.fixed:
            io.bind_ortvalue_input(name, value)
        for name, value in zip(self.past_names, self.past, strict=True):
            io.bind_ortvalue_input(name, value)
        io.bind_ortvalue_output("logits", self.logits_value)
        for name in self.present_names:
            io.bind_output(name, self.model._device)
        self.session.run_with_iobinding(io)
        self.past = io.get_outputs()[1:]
        return self.logits
