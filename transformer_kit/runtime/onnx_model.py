"""``OnnxModel``: run an exported model in onnxruntime (forward and generation).

Needs numpy and onnxruntime only: not torch, not the plugin that built the model. One instance
may be used from many threads at once (sessions are thread-safe; every call keeps its own
state). On CUDA the key/value cache stays on the device between steps (IO binding)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from transformer_kit.core.decoding import (
    DecodingCall,
    GenerationConfig,
    generate_tokens,
    stream_tokens,
    text,
)
from transformer_kit.core.decoding.defaults import call_config
from transformer_kit.core.decoding.logprobs import (
    MAX_TOP_LOGPROBS,
    Generation,
    TokenLogprob,
    prompt_logprobs,
    row_reports,
)
from transformer_kit.core.decoding.prompts import (
    as_array,
    check_source_inputs,
    check_stop,
    prepare_call,
    real_from_mask,
    real_from_pad,
)
from transformer_kit.core.decoding.text import chat_reply, stream_chat_reply
from transformer_kit.core.embedding import RerankResult, SentenceTasks
from transformer_kit.core.embedding.api import DEFAULT_BATCH_TOKENS
from transformer_kit.core.errors import ArtifactError, ConfigError, InputError
from transformer_kit.core.id_checks import check_id_array, check_positions
from transformer_kit.core.speech import (
    Transcriber,
    Transcription,
    as_samples,
    model_generate,
    transcribe_options,
)
from transformer_kit.core.speech_config import SpeechConfig
from transformer_kit.runtime.adapters import adapter_names, read_adapter_values
from transformer_kit.runtime.cache_layout import CacheLayout, one_row_exact
from transformer_kit.runtime.left_padded import CUDA_PREFILL_CHUNK, PREFILL_CHUNK, Aligned, LeftPadded
from transformer_kit.runtime.manifest import Manifest, check_graph
from transformer_kit.runtime.providers import CPU, CUDA, exact_float32, resolve_providers
from transformer_kit.runtime.shared_buffer import SharedBuffer
from transformer_kit.runtime.step_graph import StepGraph
from transformer_kit.runtime.stepper import LayoutStepper
from transformer_kit.tokenizer import TextTokenizer

#: Graph inputs made from the ids' mask rather than given as ids.
_MASK_INPUTS = ("attention_mask", "pooling_mask", "token_type_ids")
_NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16}
#: The step graph over cache buffers shared by past and present.
SHARED_STEP = "decoder_step_shared"
#: Most bytes of float32 logits a prompt's log probabilities may take (``prompt_logprobs``).
MAX_PROMPT_LOGITS_BYTES = 1 << 30
#: onnxruntime optimizers skipped on the CPU by default (see ``OnnxModel``).
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def check_ids(x: Any, vocab: int, name: str) -> np.ndarray:
    """(batch, len) integer ids within [0, vocab), as contiguous int64."""
    ids = as_array(x, name)
    check_id_array(name, ids.dtype.kind in "iu", ids.dtype, ids.shape,
                   lambda: (int(ids.min()), int(ids.max())), vocab)
    return np.ascontiguousarray(ids, dtype=np.int64)


class OnnxModel:
    """An exported model in onnxruntime; mirrors the PyTorch model's forward and generate.

    Args:
        path: the folder ``export_onnx`` wrote.
        providers: ``"auto"`` (CUDA where a CUDA session really works, else CPU), ``"cpu"``,
            ``"cuda"``, or a list of onnxruntime providers (names or (name, options) pairs).
        session_options: an ``onnxruntime.SessionOptions`` used for every graph.
        disabled_optimizers: onnxruntime graph optimizers to skip. ``"auto"`` skips
            ``SkipLayerNormFusion`` on the CPU: onnxruntime's CPU SkipLayerNormalization kernel
            is slower than the LayerNormalization and Add it replaces (docs/benchmarks/history.md);
            on CUDA the fusion is kept. Pass ``()`` to keep every optimizer.
        batch_invariant: a decoder's rows decode bit for bit as alone, in a batch of any size
            (``generate`` of several prompts, the server's engine): prompts of one length run
            together, and where this CPU multiplies one row by a kernel of its own (checked
            once, on the first decoding call) a lone row's token runs as two copies; in a
            left-padded cache each row's columns also keep their remainder modulo 16 and rows
            join a running batch every 16th step (docs/export.md, "Batch invariance"). False:
            prompts are left-padded into one run and rows join at the next step.
        cache_layout: where a decoder's keys and values sit (docs/export.md, "Cache layouts"):
            ``"shared_buffer"``, one buffer per cache tensor read and written in place by the
            step (an export with a ``decoder_step_shared`` graph, on the CPU); ``"left_padded"``,
            a new cache of past + new columns each step (every export); ``"auto"`` (default):
            the shared buffer where it can run, else left-padded.
    """

    def __init__(self, path: str | Path, providers: str | Sequence = "auto", *,
                 session_options: ort.SessionOptions | None = None,
                 disabled_optimizers: str | Sequence[str] = "auto", batch_invariant: bool = True,
                 cache_layout: str = "auto") -> None:
        self.path = Path(path)
        self.manifest = Manifest.read(self.path)
        self._providers = exact_float32(resolve_providers(providers), self.manifest.dtype)
        self._options = session_options
        if session_options is None and adapter_names(self.path):
            # onnxruntime warns once per adapter input that it is an initializer it may not fold
            # (the point: its empty default is overridden per call); warnings are not shown
            self._options = ort.SessionOptions()
            self._options.log_severity_level = 3
        if disabled_optimizers == "auto":
            names = [_provider_name(p) for p in self._providers]
            disabled_optimizers = () if CUDA in names else CPU_DISABLED_OPTIMIZERS
        self._disabled_optimizers = list(disabled_optimizers)
        # The forward graph of a generating model is loaded on its first call only: decoding
        # runs on the step graph, and a session holds its own packed copy of the weights.
        for graph in self.manifest.graphs.values():  # every graph is checked now, loaded when used
            check_graph(self.path, graph.file, graph.inputs, graph.outputs)
        #: The step graph decoding runs on (None: a model that does not generate).
        self.step_name = self._step_graph_name(cache_layout)
        if self.step_name == SHARED_STEP:
            # GroupQueryAttention's flash kernel splits a long row's keys over threads when a batch
            # has fewer rows x heads than threads, so a row's sums would depend on the batch; its
            # other kernel never splits a row (read when a session is made)
            os.environ.setdefault("ORT_GQA_DISABLE_FLASH_ATTENTION", "1")
        steps = {"decoder_step", SHARED_STEP} - {self.step_name}
        eager = [n for n in self.manifest.graphs
                 if n not in steps and (n != "model" or len(self.manifest.graphs) == 1)]
        self._sessions = {name: self._load(name) for name in eager}
        self._lock = threading.Lock()
        #: The execution provider the sessions really run on.
        self.provider: str = self._sessions[eager[0]].get_providers()[0]
        self._device = "cuda" if self.provider == CUDA else "cpu"
        #: The numpy dtype of the key/value cache (the export's float type).
        self.cache_dtype = _NUMPY_DTYPES[self.manifest.dtype]
        #: The decoder step graph (None: a model that does not generate).
        self.step_graph = None
        if self.step_name is not None:
            m = self.manifest
            self.step_graph = StepGraph(self._sessions[self.step_name], m.graphs[self.step_name],
                                        vocab=m.tgt_vocab, kv_heads=m.kv_heads, head_dim=m.head_dim,
                                        dtype=self.cache_dtype, device=self._device,
                                        providers=self._providers)
        #: The tokenizer exported with the model (text in, text out), or None.
        self.tokenizer = TextTokenizer.from_folder(self.path) if self.manifest.tokenizer else None
        #: The checkpoint's sampling defaults (its generation_config.json's, kept by the export):
        #: used where a call does not set them (``transformer_kit.core.decoding.defaults``); set it to
        #: {} to ignore them, or pass ``use_generation_defaults=False`` to one call.
        self.generation_defaults: dict[str, Any] = dict(self.manifest.generation_defaults)
        #: ``embed``/``encode``, ``score`` and ``rerank``, run through this export's batches.
        self.sentences = SentenceTasks(self)
        self._adapter_cache: dict[str, dict[str, np.ndarray]] = {}
        #: Whether a decoder's rows decode bit for bit as alone, in a batch of any size.
        self.batch_invariant = batch_invariant
        self._fewest: int | None = None
        #: A mixture of experts (a component with ``num_experts``): its experts' products change
        #: with the rows routed to them, so neither prefill chunks nor lone-row copies make its
        #: rows invariant (docs/export.md), and each chunk would read the experts again.
        self._mixture = _routes_experts(self.manifest.config)

    def _step_graph_name(self, cache_layout: str) -> str | None:
        """The step graph of ``cache_layout`` (the class says how ``"auto"`` chooses)."""
        layouts = ("auto", "shared_buffer", "left_padded")
        if cache_layout not in layouts:
            raise InputError(f"cache_layout={cache_layout!r} is not one of {', '.join(map(repr, layouts))}.")
        graphs = self.manifest.graphs
        if "decoder_step" not in graphs:
            return None
        on_cpu = _provider_name(self._providers[0]) == CPU
        if cache_layout == "shared_buffer" and (SHARED_STEP not in graphs or not on_cpu):
            why = ("it has no decoder_step_shared graph (its attention or its export's opset cannot "
                   "share a buffer; docs/export.md)" if SHARED_STEP not in graphs
                   else "the shared buffer runs on the CPU provider")
            raise InputError(f"cache_layout='shared_buffer' cannot run {str(self.path)!r}: {why}. "
                             "Use cache_layout='auto'.")
        if cache_layout == "left_padded" or SHARED_STEP not in graphs or not on_cpu:
            return "decoder_step"
        return SHARED_STEP

    def session(self, name: str) -> ort.InferenceSession:
        """The onnxruntime session of graph ``name`` of the manifest (``model``,
        ``decoder_step``, ``encoder``), loaded on first use."""
        session = self._sessions.get(name)
        if session is None:
            with self._lock:
                if name not in self._sessions:
                    self._sessions[name] = self._load(name)
                session = self._sessions[name]
        return session

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
        return session

    # -- forward ---------------------------------------------------------------------------
    @property
    def adapters(self) -> list[str]:
        """The LoRA adapters exported beside the base (``adapter=`` of a call picks one)."""
        return adapter_names(self.path)

    def _adapter_arrays(self, name: str | None) -> dict[str, np.ndarray]:
        """Adapter ``name``'s graph inputs (read once); None: none (the base)."""
        if name is None:
            return {}
        with self._lock:
            if name not in self._adapter_cache:
                self._adapter_cache[name] = read_adapter_values(self.path, name)
            return self._adapter_cache[name]

    def _adapter_values(self, name: str | None) -> dict[str, ort.OrtValue]:
        """Adapter ``name``'s graph inputs as values on this model's device, for a binding."""
        return {key: ort.OrtValue.ortvalue_from_numpy(array, self._device, 0)
                for key, array in self._adapter_arrays(name).items()}

    def __call__(self, *ids: Any, attention_mask: Any = None, adapter: str | None = None) -> np.ndarray:
        """encoder_decoder: (src_ids, tgt_ids) -> logits; decoder: (input_ids) -> logits;
        encoder: (input_ids) -> hidden states (or logits). Arrays of (batch, len) ids.
        ``adapter``: the name of a LoRA adapter exported beside the base (:attr:`adapters`).

        ``attention_mask`` (batch, len) of ``input_ids`` (or ``src_ids``): 1 = real token,
        0 = padding, as transformers takes it; without one, padding is where ``pad_id`` is."""
        m = self.manifest
        graph = m.graphs["model"]
        names = [n for n in graph.inputs if n not in _MASK_INPUTS]
        if len(ids) != len(names):
            raise InputError(f"This {m.architecture} model takes {len(names)} input(s) "
                             f"({', '.join(names)}), got {len(ids)}.")
        if names[0] == "input_features":  # a frontend's features, then the target's ids
            return self._features_forward(*ids, attention_mask=attention_mask)
        vocabs = [m.src_vocab, m.tgt_vocab] if m.architecture == "encoder_decoder" else [m.src_vocab]
        feeds = {name: check_ids(x, vocab, name) for name, x, vocab in zip(names, ids, vocabs, strict=True)}
        first = feeds[names[0]]
        real = (real_from_pad(first, m.pad_id) if attention_mask is None
                else real_from_mask(attention_mask, first.shape))
        check_positions(int(real.sum(axis=1).max()) if real.size else 0, m.max_positions, names[0])
        if m.architecture == "encoder_decoder":  # targets are never padding-masked
            check_positions(feeds["tgt_ids"].shape[1], m.max_positions, "tgt_ids")
            if len(feeds["src_ids"]) != len(feeds["tgt_ids"]):
                raise InputError(f"src_ids has {len(feeds['src_ids'])} rows but tgt_ids has "
                                 f"{len(feeds['tgt_ids'])}; give one target row per source row.")
        if "attention_mask" in graph.inputs:
            feeds["attention_mask"] = real.astype(np.int64)
        elif attention_mask is not None:
            raise InputError(f"{self.path} was exported without an attention_mask input; export "
                             "the model again to pass one.")
        for name in ("pooling_mask", "token_type_ids"):  # every real token pooled; one segment
            if name in graph.inputs:
                feeds[name] = real.astype(np.int64) if name == "pooling_mask" else np.zeros_like(first)
        session = self.session("model")
        accepted = {i.name for i in session.get_overridable_initializers()}
        feeds.update({k: v for k, v in self._adapter_arrays(adapter).items() if k in accepted})
        return session.run(None, feeds)[0]

    def _features_forward(self, features: Any, tgt_ids: Any, attention_mask: Any) -> np.ndarray:
        """``__call__`` of a model whose source is features: logits (batch, len, vocab)."""
        check_source_inputs(decoder=False, features=True, attention_mask=attention_mask)
        feeds = {"input_features": self.check_features(features),
                 "tgt_ids": check_ids(tgt_ids, self.manifest.tgt_vocab, "tgt_ids")}
        check_positions(feeds["tgt_ids"].shape[1], self.manifest.max_positions, "tgt_ids")
        if len(feeds["input_features"]) != len(feeds["tgt_ids"]):
            raise InputError(f"input_features has {len(feeds['input_features'])} rows but tgt_ids "
                             f"has {len(feeds['tgt_ids'])}; give one target row per source row.")
        return self.session("model").run(None, feeds)[0]

    def prompt_logprobs(self, ids: Any, top: int = 0, *, adapter: str | None = None
                        ) -> list[TokenLogprob | None]:
        """Each token's log probability given the tokens before it, as vLLM's
        ``prompt_logprobs`` and OpenAI's ``echo`` report them: ``ids`` (length,) one decoder
        prompt; ``top`` how many of the most likely tokens to list at each position (0..20).
        The first token has none (None). Runs the forward graph (loaded on first use) over the
        whole prompt; InputError for a prompt whose logits would pass
        :data:`MAX_PROMPT_LOGITS_BYTES`."""
        prompt = check_ids(np.reshape(ids, (1, -1)), self.manifest.src_vocab, "prompt")
        self.check_prompt_logprobs(prompt.shape[1], top)
        logits = self(prompt, adapter=adapter)[0]  # (length, vocab)
        return prompt_logprobs(logits, prompt[0], top)

    def check_prompt_logprobs(self, length: int, top: int) -> None:
        """Refuse, with a sentence, a prompt report this model cannot give: not a decoder, a
        ``top`` outside 0..20, or a prompt whose logits would take more than
        :data:`MAX_PROMPT_LOGITS_BYTES`."""
        m = self.manifest
        if m.architecture != "decoder":
            raise InputError(f"Prompt log probabilities are a decoder's; this model is "
                             f"{m.architecture!r}.")
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InputError(f"prompt_logprobs is {top!r}; give how many of the most likely tokens "
                             f"to list at each prompt position, 0 to {MAX_TOP_LOGPROBS}.")
        if (need := length * m.tgt_vocab * 4) > MAX_PROMPT_LOGITS_BYTES:
            most = MAX_PROMPT_LOGITS_BYTES // (m.tgt_vocab * 4)
            raise InputError(f"Log probabilities of a {length}-token prompt take the logits of every "
                             f"position ({need / 2**30:.1f} GiB over a vocabulary of {m.tgt_vocab}); "
                             f"this model reports them for prompts of at most {most} tokens. Split "
                             "the prompt, or leave out echo / prompt_logprobs.")

    # -- sentence tasks (SentenceTasks over this export's runs) -----------------------------
    def encode(self, inputs: Any, *, normalize: bool | None = None, prompt_name: str | None = None,
               prompt: str | None = None, dimensions: int | None = None, batch_size: int = 32,
               max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS) -> np.ndarray:
        """Sentence embeddings (n, dim) float32 of texts or token ids, as sentence-transformers'
        ``encode``: see :meth:`SentenceTasks.encode <transformer_kit.core.embedding.SentenceTasks.encode>`."""
        return self.sentences.encode(inputs, normalize=normalize, prompt_name=prompt_name,
                                     prompt=prompt, dimensions=dimensions, batch_size=batch_size,
                                     max_batch_tokens=max_batch_tokens)

    embed = encode

    def score(self, query: str, documents: Sequence[str], *, batch_size: int = 32,
              max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS) -> np.ndarray:
        """A cross-encoder's scores of (query, document) pairs, (n,) or (n, num_labels) float32:
        see :meth:`SentenceTasks.score <transformer_kit.core.embedding.SentenceTasks.score>`."""
        return self.sentences.score(query, documents, batch_size=batch_size,
                                    max_batch_tokens=max_batch_tokens)

    def rerank(self, query: str, documents: Sequence[str], *, top_n: int | None = None,
               return_documents: bool = False, batch_size: int = 32,
               max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS) -> list[RerankResult]:
        """The documents by relevance to ``query``, best first: see
        :meth:`SentenceTasks.rerank <transformer_kit.core.embedding.SentenceTasks.rerank>`."""
        return self.sentences.rerank(query, documents, top_n=top_n, return_documents=return_documents,
                                     batch_size=batch_size, max_batch_tokens=max_batch_tokens)

    def embedding_settings(self) -> tuple[dict, int | None]:
        return self.manifest.config, self.manifest.max_positions

    def _run_outputs(self, output: str, ids: np.ndarray, real: np.ndarray,
                     extra: tuple[str, np.ndarray]) -> np.ndarray:
        graph = self.manifest.graphs["model"]
        feeds = {"input_ids": ids, "attention_mask": real.astype(np.int64)}
        if extra[0] in graph.inputs:
            feeds[extra[0]] = extra[1]
        return self.session("model").run([output], feeds)[0]

    def run_embedding(self, ids: np.ndarray, real: np.ndarray, pooled: np.ndarray) -> np.ndarray:
        return self._run_outputs("sentence_embedding", ids, real, ("pooling_mask", pooled))

    def run_scores(self, ids: np.ndarray, real: np.ndarray, types: np.ndarray) -> np.ndarray:
        output = "scores" if "scores" in self.manifest.graphs["model"].outputs else "logits"
        return self._run_outputs(output, ids, real, ("token_type_ids", types))

    # -- chat ------------------------------------------------------------------------------
    def chat(self, messages: list[dict], *, tools: list[dict] | None = None, tool_choice: Any = None,
             chat_template: str | None = None, template_kwargs: dict | None = None,
             **options: Any) -> dict[str, Any]:
        """The assistant's reply to a conversation, as ``TransformerModel.chat`` (the exported
        tokenizer prepares the turn, :meth:`generate` writes it)."""
        return chat_reply(self, messages, tools=tools, tool_choice=tool_choice,
                          chat_template=chat_template, template_kwargs=template_kwargs, **options)

    def stream_chat(self, messages: list[dict], *, tools: list[dict] | None = None,
                    tool_choice: Any = None, chat_template: str | None = None,
                    template_kwargs: dict | None = None, **options: Any) -> Iterator[str]:
        """As :meth:`chat`, yielding the reply's text in pieces as it is generated."""
        return stream_chat_reply(self, messages, tools=tools, tool_choice=tool_choice,
                                 chat_template=chat_template, template_kwargs=template_kwargs,
                                 **options)

    # -- generation ------------------------------------------------------------------------
    @property
    def context_length(self) -> int | None:
        """Most positions a sequence may take: the positional bound, else the config's max_len."""
        m = self.manifest
        return m.max_positions if m.max_positions is not None else m.config.get("max_len")

    def generate(self, ids: Any, max_new_tokens: int | None = None, *, attention_mask: Any = None,
                 generation_config: GenerationConfig | dict | None = None, stop_matcher=None,
                 add_special_tokens: bool = True, assistant_model: OnnxModel | None = None,
                 adapter: str | None = None, decoder_input_ids: Any = None,
                 **options: Any) -> np.ndarray:
        """New tokens for each prompt, token for token as ``model.generate`` with the same
        options (greedy, sampling with a seed, beam search): (batch, len) prompts (decoder;
        padding from ``attention_mask``, 1 = real token, or else ``pad_id``) or source ids
        (encoder_decoder, decoded from bos_id) -> (batch x num_return_sequences, steps) int64;
        a row that ended holds pad_id (or its eos id) after it. Text prompts (a string or a
        list of them) give text, encoded with the tokenizer's special tokens unless
        ``add_special_tokens`` is False (a rendered chat holds its own). ``assistant_model``: a
        smaller export of the same vocabulary drafting tokens (docs/generation.md).
        ``adapter``: the name of a LoRA adapter exported beside the base (:attr:`adapters`),
        bound for this call; None: the base. With the option ``logprobs``: a
        :class:`~transformer_kit.core.decoding.logprobs.Generation` of the tokens and each row's
        log probability reports (text prompts: each reply's ``logprobs``)."""
        if max_new_tokens is not None:
            options["max_new_tokens"] = max_new_tokens
        opts = call_config(self.generation_defaults, generation_config, options)
        prompts = text.as_prompts(ids)
        if prompts is not None:
            tokenizer = text.require(self.tokenizer, str(self.path))
            ids, attention_mask = tokenizer.encode(prompts[0], add_special_tokens)
            stop_matcher = tokenizer.stop_matcher(opts.stop) if opts.stop else None
        stepper, call, pipeline = self._plan(ids, attention_mask, opts, stop_matcher, assistant_model,
                                             adapter, decoder_input_ids)
        tokens = generate_tokens(stepper, call, opts, pipeline)
        reports = None if opts.logprobs is None else row_reports(call.logprobs, len(tokens))
        if prompts is None:
            return tokens if reports is None else Generation(tokens, reports)
        out = text.row_texts(tokenizer, tokens, opts.eos_ids(self.manifest.eos_id), opts.stop, reports)
        return out[0] if prompts[1] and len(out) == 1 else out

    def stream(self, ids: Any, max_new_tokens: int | None = None, *, attention_mask: Any = None,
               generation_config: GenerationConfig | dict | None = None, stop_matcher=None,
               add_special_tokens: bool = True, assistant_model: OnnxModel | None = None,
               adapter: str | None = None, decoder_input_ids: Any = None,
               **options: Any) -> Iterator[np.ndarray]:
        """As :meth:`generate` (greedy search or sampling), yielding each step's tokens
        (batch x num_return_sequences,) int64 as they are chosen."""
        if max_new_tokens is not None:
            options["max_new_tokens"] = max_new_tokens
        opts = call_config(self.generation_defaults, generation_config, options)
        if opts.num_beams > 1:
            raise InputError("stream yields tokens as they are chosen, but beam search chooses "
                             f"them only at the end (num_beams={opts.num_beams}); call generate.")
        prompts = text.as_prompts(ids)
        if prompts is not None:
            tokenizer = text.require(self.tokenizer, str(self.path))
            ids, attention_mask = tokenizer.encode(prompts[0], add_special_tokens)
            stop_matcher = tokenizer.stop_matcher(opts.stop) if opts.stop else None
        stepper, call, pipeline = self._plan(ids, attention_mask, opts, stop_matcher, assistant_model,
                                             adapter, decoder_input_ids)
        steps = stream_tokens(stepper, call, opts, pipeline)
        if prompts is None:
            return steps
        rows = len(ids) * opts.num_return_sequences
        return text.stream_text(tokenizer, steps, rows, opts.eos_ids(self.manifest.eos_id),
                                opts.stop, prompts[1] and rows == 1)

    @property
    def takes_features(self) -> bool:
        """Whether the source is features (``input_features``: audio), not token ids."""
        encoder = self.manifest.graphs.get("encoder")
        return encoder is not None and "input_features" in encoder.inputs

    def audio_features(self, samples: Any) -> np.ndarray:
        """samples (batch, n_samples) float32 (16 kHz audio) -> the encoder's features (batch,
        channels, frames) float32, by the export's ``features`` graph (Whisper's log-mel)."""
        if "features" not in self.manifest.graphs:
            raise InputError(f"{self.path} has no features graph (its config names no 'features' "
                             "component); give the features themselves.")
        samples = as_array(samples, "samples")
        if samples.ndim == 1:
            samples = samples[None]
        if samples.ndim != 2 or samples.dtype.kind != "f" or samples.shape[1] == 0:
            raise InputError(f"samples must be (batch, n_samples) floats, n_samples >= 1; got "
                             f"dtype {samples.dtype} of shape {tuple(samples.shape)}.")
        if not np.isfinite(samples).all():
            raise InputError("samples hold NaN or infinite values; give finite samples.")
        return self.session("features").run(None, {"samples": np.ascontiguousarray(samples, np.float32)})[0]

    @property
    def aligner(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray] | None:
        """:meth:`alignment_weights` where the export has its graph (word timestamps), else None."""
        return self.alignment_weights if "alignment" in self.manifest.graphs else None

    def alignment_weights(self, features: Any, tokens: Any) -> np.ndarray:
        """The alignment heads' cross-attention probabilities (batch, heads, len, src_len)
        float32 of features (batch, channels, frames) with ``tokens`` (batch, len) as the
        decoder's input, teacher-forced, by the export's ``alignment`` graph: what word
        timestamps are read from."""
        if "alignment" not in self.manifest.graphs:
            raise InputError(f"{self.path} has no alignment graph, which word timestamps need (an "
                             "export of a speech model with alignment heads writes one); export "
                             "it again with this version of the kit.")
        ids = as_array(tokens, "tokens")
        if ids.ndim != 2 or ids.dtype.kind not in "iu" or ids.shape[1] == 0:
            raise InputError(f"tokens must be (batch, len) integers, len >= 1; got dtype {ids.dtype} "
                             f"of shape {tuple(ids.shape)}.")
        return self.session("alignment").run(None, {
            "input_features": self.check_features(features),
            "input_ids": np.ascontiguousarray(ids, np.int64)})[0]

    def transcribe(self, audio: Any, *, sample_rate: int | None = None,
                   progress: Callable[[float, float], None] | None = None,
                   **options: Any) -> Transcription:
        """Speech to text (an export of a speech model: Whisper), as transformers' long-form
        ``generate``, as ``model.transcribe`` does it in PyTorch: ``audio`` a file's path or
        bytes, or samples (n,) with their ``sample_rate``; ``options``: the
        :class:`~transformer_kit.core.speech.TranscribeOptions`. Returns a
        :class:`~transformer_kit.core.speech.Transcription`."""
        settings = self.manifest.config.get("speech")
        if settings is None or "features" not in self.manifest.graphs:
            raise InputError(f"transcribe needs a speech model (Whisper); {self.path} is an export "
                             "without speech settings or a features graph.")
        transcriber = Transcriber(
            SpeechConfig.model_validate(settings), self.audio_features,
            model_generate(self, np.ascontiguousarray), text.require(self.tokenizer, str(self.path)),
            self.manifest.tgt_vocab, self.context_length, self.aligner)
        return transcriber.transcribe(as_samples(audio, sample_rate), transcribe_options(**options),
                                      progress)

    def check_features(self, features: Any) -> np.ndarray:
        """(batch, channels, frames) finite float32 features of this model's encoder."""
        x = as_array(features, "input_features")
        frontend = self.manifest.config.get("frontend")
        channels = frontend.get("in_channels") if isinstance(frontend, dict) else None
        if x.ndim != 3 or x.dtype.kind != "f" or (channels is not None and x.shape[1] != channels):
            raise InputError(f"This model's source is features of shape (batch, {channels}, frames) "
                             f"float32; got dtype {x.dtype} of shape {tuple(x.shape)}. For audio, "
                             "make them with audio_features(samples).")
        if not np.isfinite(x).all():
            raise InputError("input_features hold NaN or infinite values; give finite features.")
        return np.ascontiguousarray(x, dtype=np.float32)

    def _plan(self, ids: Any, attention_mask: Any, options: GenerationConfig, stop_matcher,
              assistant: OnnxModel | None = None, adapter: str | None = None,
              decoder_prompt: Any = None) -> tuple[LayoutStepper, DecodingCall, Any]:
        m = self.manifest
        check_stop(options, stop_matcher)
        if self.step_graph is None:
            raise InputError(f"generate needs a decoder; this model's architecture is {m.architecture!r}.")
        is_decoder = m.architecture == "decoder"
        if not is_decoder and m.bos_id is None:
            raise ConfigError("bos_id is null, but encoder_decoder decoding starts from bos_id; "
                              "export the model again with a bos_id in its config.")
        features = not is_decoder and self.takes_features
        check_source_inputs(decoder=is_decoder, features=features, attention_mask=attention_mask,
                            decoder_prompt=decoder_prompt)
        if features:  # no token ids: every output of the frontend is real
            source = self.check_features(ids)
            ids = np.zeros((len(source), 0), np.int64)
        else:
            ids = source = check_ids(ids, m.src_vocab, "input_ids" if is_decoder else "src_ids")
        call, pipeline, real = prepare_call(
            ids, attention_mask, options, decoder=is_decoder, pad_id=None if features else m.pad_id,
            eos_id=m.eos_id, bos_id=m.bos_id, vocab=m.tgt_vocab, context_length=self.context_length,
            source_positions=None if is_decoder or features else m.max_positions,
            stop_matcher=stop_matcher, forced_bos_id=m.config.get("forced_bos_id"),
            tokenizer=self.tokenizer, decoder_prompt=decoder_prompt)
        if assistant is not None:
            call.assistant = self._assistant_stepper(assistant, call.prompt_ids, real)
        fixed = None if is_decoder else self.encode_source(source, real)
        layout = self.cache_layout(adapter, fixed=fixed)
        return LayoutStepper(layout, call.prompt_ids, call.prompt_real), call, pipeline

    def _assistant_stepper(self, assistant: Any, prompt_ids: np.ndarray, real: np.ndarray) -> LayoutStepper:
        """``assistant``'s stepper over the same prompt, once it can draft for this model."""
        if not isinstance(assistant, OnnxModel) or assistant.manifest.architecture != "decoder":
            raise InputError("assistant_model must be an OnnxModel of a decoder, got "
                             f"{type(assistant).__name__}.")
        if (vocab := assistant.manifest.tgt_vocab) != self.manifest.tgt_vocab:
            raise InputError(f"The assistant model's vocabulary has {vocab} tokens and this model's "
                             f"{self.manifest.tgt_vocab}; an assistant drafts with the same tokenizer.")
        return LayoutStepper(assistant.cache_layout(), prompt_ids, real)

    def batch_decoder(self, adapter: str | None = None) -> CacheLayout:
        """An empty running batch over this model's step graph, for continuous batching (a
        server's engine): rows join after their own prefill and leave when they finish. A
        decoder's, or a speech model's (its rows bring their encoder outputs: :meth:`encode_source`);
        one caller at a time (the engine's loop). ``adapter``: every row decodes with that LoRA
        adapter (:attr:`adapters`)."""
        m = self.manifest
        if m.architecture != "decoder" and not self.takes_features:
            raise InputError("Continuous batching serves decoders and speech models; this model's "
                             f"architecture is {m.architecture!r}. Export a decoder to serve it.")
        if m.architecture != "decoder" and "attention_mask" not in self.step_graph.inputs:
            raise InputError(f"{self.path} was exported before the encoder-decoder step graph took "
                             "an attention_mask, which a batch of rows of other lengths needs; "
                             "export the model again to serve it.")
        return self.cache_layout(adapter, fixed=[] if m.architecture != "decoder" else None)

    def cache_layout(self, adapter: str | None = None, *, fewest_rows: int | None = None,
                     fixed: list[Any] | None = None) -> CacheLayout:
        """An empty batch of a decoder's rows in this model's cache layout (docs/export.md,
        "Cache layouts"): a :class:`SharedBuffer` over ``decoder_step_shared``; over
        ``decoder_step``, an :class:`Aligned` one when ``batch_invariant``, else a
        :class:`LeftPadded` one. ``adapter``: its rows decode with that LoRA adapter;
        ``fewest_rows``: a lone row's token runs as that many copies (default: as this CPU
        needs for invariance, :meth:`fewest_rows`). An encoder-decoder's rows read ``fixed``,
        its encoder's outputs (:meth:`encode_source`; [] for rows that bring their own); an
        export whose step graph takes no target mask (exported before it did) gets a
        :class:`LeftPadded` batch of rows of one length."""
        values = self._adapter_values(adapter)
        aligned = self.batch_invariant and (fixed is None or "attention_mask" in self.step_graph.inputs)
        if not aligned and self.step_name != SHARED_STEP:
            return LeftPadded(self.step_graph, values, fixed=fixed)
        fewest = self.fewest_rows() if fewest_rows is None else fewest_rows
        if self.step_name == SHARED_STEP:
            return SharedBuffer(self.step_graph, values, fewest)
        chunk = None if self._mixture else PREFILL_CHUNK if self._device == "cpu" else CUDA_PREFILL_CHUNK
        return Aligned(self.step_graph, values, fewest, chunk, fixed)

    def fewest_rows(self) -> int:
        """The fewest rows a decoder's batch-invariant step multiplies: 2 where one token of one
        row gets other logits than in a batch of two (``one_row_exact``, checked once), else 1.
        A mixture of experts' rows stay 1: its experts' products change with the rows routed to
        them whatever a lone row does (docs/export.md), so copies would cost without a gain."""
        if self._fewest is None:
            exact = (not self.batch_invariant or self.manifest.architecture != "decoder" or self._mixture
                     or one_row_exact(lambda: self.cache_layout(fewest_rows=1)))
            self._fewest = 1 if exact else 2
        return self._fewest

    def encode_source(self, source: np.ndarray, real: np.ndarray | None = None) -> list[Any]:
        """Run the encoder once on ``source`` (src_ids (batch, src_len) with ``real`` (batch,
        src_len) bool, or input_features (batch, channels, frames), checked): the step graph's
        inputs it gives (encoder_attention_mask and every layer's cross keys/values, rows first),
        in the step graph's order, on the graphs' device."""
        session = self.session("encoder")
        graph = self.manifest.graphs["encoder"]
        io = session.io_binding()
        io.bind_cpu_input("input_features" if self.takes_features else "src_ids", source)
        if "attention_mask" in graph.inputs:
            io.bind_cpu_input("attention_mask", real.astype(np.int64))
        for name in graph.outputs:
            io.bind_output(name, self._device)
        session.run_with_iobinding(io)
        outputs = dict(zip(graph.outputs, io.get_outputs(), strict=True))
        return [outputs[name] for name in self.step_graph.fixed_names]


def _provider_name(entry: Any) -> str:
    """A provider's name, given as a name or a (name, options) pair."""
    return entry[0] if isinstance(entry, (tuple, list)) else entry


def _routes_experts(config: Any) -> bool:
    """Whether a model config (a manifest's, nested dicts and lists) names a mixture of experts
    (a component with ``num_experts``)."""
    if isinstance(config, dict):
        return "num_experts" in config or any(_routes_experts(v) for v in config.values())
    if isinstance(config, list):
        return any(_routes_experts(v) for v in config)
    return False
