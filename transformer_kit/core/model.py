"""The assembled models: encoder-decoder (the paper), encoder-only and decoder-only.

Every model is a plain ``torch.nn.Module`` built from registry components by
:func:`transformer_kit.build_model`. Decoding runs through one step function taking explicit
key/value caches (:class:`LayerCache`, plain tensors), so the uncached forward, cached
generation and the exported decoder step share one code path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from transformer_kit.core.config import ModelConfig
from transformer_kit.core.decoding import GenerationConfig
from transformer_kit.core.decoding.text import Tokenizer, chat_reply, stream_chat_reply
from transformer_kit.core.decoding.text import require as text_require
from transformer_kit.core.decoding.torch_steps import eval_mode, generate, stream
from transformer_kit.core.embedding.api import DEFAULT_BATCH_TOKENS, RerankResult, SentenceTasks
from transformer_kit.core.embedding.heads import ClassifierHead, SentenceHead
from transformer_kit.core.errors import InputError
from transformer_kit.core.inputs import check_features, check_samples, check_token_ids, tracing
from transformer_kit.core.interfaces import AttentionInputs, AttentionMask, AttentionWeights, LayerCache
from transformer_kit.core.masks import real_tokens
from transformer_kit.core.registry_entries import RegisteredComponent, component_of
from transformer_kit.core.serialization import save_model
from transformer_kit.core.speech import (
    Transcriber,
    Transcription,
    as_samples,
    model_generate,
    transcribe_options,
)
from transformer_kit.core.stacks import Embedder, FeatureEmbedder, Stack, self_attention_inputs


class TransformerModel(nn.Module):
    """Base of the assembled models: config, save, cache construction, generation."""

    architecture: str

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        #: The registered component of each kind, with its plugin (set by build_model).
        self.components: dict[str, RegisteredComponent] = {}
        #: Per layer variant (``layer_types``), the registered components it replaces.
        self.layer_components: dict[str, dict[str, RegisteredComponent]] = {}
        #: The checkpoint's tokenizer (text in, text out), kept by save and export; or None.
        self.tokenizer: Tokenizer | None = None
        #: The checkpoint's sampling defaults (its generation_config.json's ``do_sample``,
        #: ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``), used where
        #: a call does not set them and kept by save and export; {} for none (set it to {} to
        #: ignore them, or pass ``use_generation_defaults=False`` to one call).
        self.generation_defaults: dict[str, Any] = {}
        #: ``from_hf(..., adapters={name: folder})``: each LoRA adapter's factors by parameter,
        #: kept apart from the weights and exported beside them; {} for none.
        self.adapters: dict[str, Any] = {}
        #: ``from_hf(..., stream=True)``: the weights, read from the checkpoint when needed
        #: (the parameters are on the meta device); None for a model in memory.
        self.streamed_weights: Any = None
        #: ``tk.from_gguf``: parameter name -> its GgufBlocks (the file's quantized blocks), for
        #: every weight matrix the file stores quantized; empty for other models.
        self.gguf_blocks: dict[str, Any] = {}

    def _lacking(self, flag: str) -> list[str]:
        """Chosen components whose ``flag`` (supports_cache, exportable) is False, named."""
        chosen = [(kind, e) for kind, e in self.components.items()]
        chosen += [(f"{kind} of layer variant {name!r}", e)
                   for name, kinds in self.layer_components.items() for kind, e in kinds.items()]
        return [f"{kind} {e.component.name!r} (plugin {e.plugin!r})"
                for kind, e in chosen if not getattr(e.component, flag)]

    @property
    def uncacheable(self) -> list[str]:
        """Components that declared ``supports_cache=False``, named with their plugin."""
        return self._lacking("supports_cache")

    def _refusing_instances(self) -> dict[str, list[str]]:
        """The modules whose configuration export refuses (their component's
        ``export_refusal`` says why), by their component named with its plugin: their reasons."""
        found: dict[str, list[str]] = {}
        for module in self.modules():
            entry = component_of(module)
            if entry is None or entry.component.export_refusal is None:
                continue
            reason = entry.component.export_refusal(module)
            if reason:
                name = f"{entry.component.kind} {entry.component.name!r} (plugin {entry.plugin!r})"
                found.setdefault(name, []).append(reason)
        return found

    @property
    def unexportable(self) -> list[str]:
        """Components that declared ``exportable=False``, or whose configuration here refuses
        export (their ``Component.export_refusal``), named with their plugin."""
        return list(dict.fromkeys([*self._lacking("exportable"), *self._refusing_instances()]))

    @property
    def unexportable_reasons(self) -> list[str]:
        """What the components that declared ``exportable=False`` say of it
        (``Component.unexportable_reason``), and what ``Component.export_refusal`` says of the
        refusing modules, each once."""
        entries = [*self.components.values(),
                   *(e for kinds in self.layer_components.values() for e in kinds.values())]
        reasons = [e.component.unexportable_reason for e in entries
                   if not e.component.exportable and e.component.unexportable_reason]
        reasons += [r for found in self._refusing_instances().values() for r in found]
        return list(dict.fromkeys(reasons))

    @property
    def max_positions(self) -> int | None:
        """Longest sequence the positional encoding covers, or None when unbounded."""
        return None

    def chat(self, messages: list[dict], *, tools: list[dict] | None = None, tool_choice: Any = None,
             chat_template: str | None = None, template_kwargs: dict | None = None,
             **options: Any) -> dict[str, Any]:
        """The assistant's reply to a conversation, rendered by the checkpoint's chat template
        (the tokenizer prepares the turn, :meth:`generate` writes it).

        Args:
            messages: ``[{"role": "system" | "user" | "assistant" | "tool", "content": ...}]``.
            tools: functions the model may call (OpenAI-style JSON schemas).
            tool_choice: ``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function",
                "function": {"name": ...}}`` (a forced call is constrained to parse).
            chat_template: a template's name or text instead of the default.
            template_kwargs: further variables for the template.
            options: generation options, ``response_format`` among them. The reply ends at any
                of the model's end ids (its end of turn among them).
        Returns:
            ``{"role": "assistant", "content": str | None}``, plus ``"tool_calls"`` (OpenAI's
            format) when the model called tools.
        """
        return chat_reply(self, messages, tools=tools, tool_choice=tool_choice,
                          chat_template=chat_template, template_kwargs=template_kwargs, **options)

    def stream_chat(self, messages: list[dict], *, tools: list[dict] | None = None,
                    tool_choice: Any = None, chat_template: str | None = None,
                    template_kwargs: dict | None = None, **options: Any) -> Iterator[str]:
        """As :meth:`chat`, yielding the reply's text in pieces as it is generated."""
        return stream_chat_reply(self, messages, tools=tools, tool_choice=tool_choice,
                                 chat_template=chat_template, template_kwargs=template_kwargs,
                                 **options)

    def save(self, path: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` into the folder ``path``."""
        return save_model(self, path)

    @property
    def context_length(self) -> int:
        """Most positions a sequence (prompt and generated tokens) may take: the positional
        encoding's bound, else the config's ``max_len`` (a checkpoint's maximum positions)."""
        bound = self.max_positions
        return bound if bound is not None else self.config.max_len

    def generate(self, ids: Tensor, max_new_tokens: int | None = None, *,
                 attention_mask: Tensor | None = None,
                 decoder_input_ids: Tensor | None = None,
                 generation_config: GenerationConfig | dict | None = None,
                 use_cache: bool = True, **options: Any) -> Tensor:
        """New tokens for each prompt, by the strategy the options choose (greedy, sampling,
        beam search: :class:`~transformer_kit.GenerationConfig`, as ``generation_config`` and/or
        keywords such as ``do_sample=True, top_p=0.9, seed=0``). Decoder models continue each
        prompt row; encoder-decoder models encode ``ids`` once and decode from ``bos_id``.

        Args:
            ids: (batch, len) int64 prompts (decoder) or source ids (encoder_decoder); with a
                frontend, the source's features (batch, channels, frames).
            attention_mask: (batch, len) 1 = real token, 0 = padding (else from ``pad_id``).
            decoder_input_ids: encoder_decoder: the target's first tokens, (k,) for every row
                or (batch, k) (Whisper's prompt), instead of ``bos_id``.
            use_cache: False recomputes the whole sequence each step (the reference).
        Returns:
            (batch x num_return_sequences, steps) int64 new tokens; a row that ended holds
            ``pad_id`` (or its eos id) after it.
        """
        if max_new_tokens is not None:
            options["max_new_tokens"] = max_new_tokens
        return generate(self, ids, attention_mask=attention_mask, config=generation_config,
                        use_cache=use_cache, decoder_input_ids=decoder_input_ids, **options)

    def stream(self, ids: Tensor, max_new_tokens: int | None = None, *,
               attention_mask: Tensor | None = None,
               decoder_input_ids: Tensor | None = None,
               generation_config: GenerationConfig | dict | None = None,
               use_cache: bool = True, **options: Any) -> Iterator[Tensor]:
        """As :meth:`generate` (greedy search or sampling), yielding each step's tokens
        (batch x num_return_sequences,) int64 as they are chosen."""
        if max_new_tokens is not None:
            options["max_new_tokens"] = max_new_tokens
        return stream(self, ids, attention_mask=attention_mask, config=generation_config,
                      use_cache=use_cache, decoder_input_ids=decoder_input_ids, **options)

    def _empty_cache(self, stack: Stack, batch: int, like: Tensor) -> list[LayerCache]:
        caches = []
        for layer in stack.layers:
            attn = layer.self_attention
            empty = like.new_zeros(batch, attn.num_kv_heads, 0, attn.head_dim)
            caches.append(LayerCache(empty, empty))
        return caches


class EncoderDecoderTransformer(TransformerModel):
    """The paper's model: ``model(src_ids, tgt_ids) -> logits`` (batch, tgt_len, tgt_vocab)."""

    architecture = "encoder_decoder"

    def __init__(self, config: ModelConfig, src_embed: Embedder | FeatureEmbedder, tgt_embed: Embedder,
                 encoder: Stack, decoder: Stack, head: nn.Linear, encoder_mask: AttentionMask,
                 decoder_mask: AttentionMask) -> None:
        super().__init__(config)
        self.src_embed, self.tgt_embed = src_embed, tgt_embed
        self.encoder, self.decoder = encoder, decoder
        self.head = head
        self.encoder_mask, self.decoder_mask = encoder_mask, decoder_mask

    @property
    def max_positions(self) -> int | None:
        return self.tgt_embed.positional.max_positions

    @property
    def takes_features(self) -> bool:
        """Whether the source is features for a frontend (audio), not token ids."""
        return isinstance(self.src_embed, FeatureEmbedder)

    def audio_features(self, samples: Tensor) -> Tensor:
        """samples (batch, n_samples) or (n_samples,) float32 (16 kHz audio, the config's
        ``features``) -> the frontend's features (batch, channels, frames), e.g. Whisper's
        log-mel spectrogram. InputError for samples of another shape or kind, or not finite."""
        if not self.takes_features or self.src_embed.features is None:
            raise InputError("This model's config names no 'features' component, so it cannot "
                             "make features from a signal; give the features themselves.")
        return self.src_embed.features(check_samples(samples))

    def encode(self, src_ids: Tensor, attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """src_ids (batch, src_len), attention_mask (batch, src_len) 1 = real token (else from
        ``pad_id``) -> memory (batch, src_len, d_model), src_real (batch, src_len) bool.

        A model with a frontend takes features instead (batch, channels, frames), e.g.
        ``model.audio_features(samples)``; every one of the frontend's outputs is real."""
        if self.takes_features:
            return self._encode_features(src_ids)
        src_ids = check_token_ids(src_ids, self.config.src_vocab, "src_ids")
        real = real_tokens(src_ids, attention_mask, self.config.pad_id)
        inputs = self_attention_inputs(real, src_ids.shape[1], self.src_embed.positional,
                                       self.encoder_mask)
        memory = self.encoder(self.src_embed(src_ids, inputs.q_positions), inputs)
        return memory, real

    def transcribe(self, audio: Any, *, sample_rate: int | None = None,
                   progress: Callable[[float, float], None] | None = None,
                   **options: Any) -> Transcription:
        """Speech to text (a model with ``speech`` settings: Whisper), as transformers' long-form
        ``generate``: see :class:`~transformer_kit.core.speech.Transcriber`.

        Args:
            audio: a file's path or bytes (any format FFmpeg reads), or samples (n,) with their
                ``sample_rate`` (default 16 kHz).
            progress: ``progress(done, total)`` in seconds after each 30 s window.
            options: :class:`~transformer_kit.core.speech.TranscribeOptions` (language, task,
                timestamps, prompt, temperature, ...).
        Returns:
            a :class:`~transformer_kit.core.speech.Transcription`: the text, its segments
            (start, end, text), the language and the duration.
        """
        with eval_mode(self):
            return self._transcriber().transcribe(as_samples(audio, sample_rate),
                                                  transcribe_options(**options), progress)

    def _transcriber(self) -> Transcriber:
        if self.config.speech is None or not self.takes_features or self.src_embed.features is None:
            raise InputError("transcribe needs a speech model (a config with 'speech' settings and "
                             "a 'features' component: Whisper); this model has none.")
        tokenizer = text_require(self.tokenizer, "This model")
        device = next(self.parameters()).device
        heads = self.config.speech.alignment_heads

        def align(features: np.ndarray, ids: np.ndarray) -> np.ndarray:
            memory, real = self.encode(torch.from_numpy(features).to(device))
            return self.cross_attention_weights(memory, real, torch.from_numpy(ids).to(device),
                                                heads).cpu().numpy()

        return Transcriber(
            self.config.speech,
            lambda samples: self.audio_features(torch.from_numpy(samples).to(device)).cpu().numpy(),
            model_generate(self, lambda array: torch.from_numpy(np.ascontiguousarray(array)).to(device)),
            tokenizer, self.config.tgt_vocab, self.context_length, align)

    def _encode_features(self, features: Tensor) -> tuple[Tensor, Tensor]:
        embed = self.src_embed
        x = embed.frontend(check_features(features, embed.frontend))
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        inputs = self_attention_inputs(real, x.shape[1], embed.positional, self.encoder_mask)
        return self.encoder(embed(x, inputs.q_positions), inputs), real

    def decode(self, tgt_ids: Tensor, memory: Tensor | None, src_real: Tensor,
               caches: list[LayerCache] | None = None, *, last_only: bool = False,
               weights: AttentionWeights | None = None) -> Tensor:
        """Logits (batch, new_len, tgt_vocab) for target tokens after the cached ones.

        Args:
            tgt_ids: (batch, new_len) the target tokens not yet in ``caches``.
            memory: (batch, src_len, d_model) from :meth:`encode`; may be None when every
                cache already holds its cross-attention keys and values.
            src_real: (batch, src_len) bool, True for real source tokens.
            caches: per-layer caches, extended in place; None for an uncached call.
            last_only: return the logits of the last position only, (batch, 1, tgt_vocab).
            weights: cross-attention probabilities to record (:meth:`cross_attention_weights`).
        """
        tgt_ids = check_token_ids(tgt_ids, self.config.tgt_vocab, "tgt_ids")
        past = caches[0].key.shape[2] if caches else 0
        batch, new_len = tgt_ids.shape
        real = torch.ones(batch, past + new_len, dtype=torch.bool, device=tgt_ids.device)
        self_inputs = self_attention_inputs(real, new_len, self.tgt_embed.positional,
                                            self.decoder_mask)
        cross_inputs = AttentionInputs(mask=src_real[:, None, None, :], memory=memory, weights=weights)
        x = self.decoder(self.tgt_embed(tgt_ids, self_inputs.q_positions), self_inputs,
                         cross_inputs, caches)
        return self.head(x[:, -1:] if last_only else x)

    def cross_attention_weights(self, memory: Tensor, src_real: Tensor, tgt_ids: Tensor,
                                heads: list[list[int]]) -> Tensor:
        """The cross-attention probabilities of ``heads`` ([layer, head] pairs: Whisper's
        alignment heads) with ``tgt_ids`` (batch, len) as the decoder's input, teacher-forced:
        (batch, len(heads), len, src_len) float32, as transformers' ``cross_attentions``."""
        weights = AttentionWeights([self.decoder.layers[layer].cross_attention for layer, _ in heads])
        self.decode(tgt_ids, memory, src_real, weights=weights)
        return torch.stack([weights.of_module(self.decoder.layers[layer].cross_attention)[:, head]
                            for layer, head in heads], dim=1)

    def forward(self, src_ids: Tensor, tgt_ids: Tensor, attention_mask: Tensor | None = None
                ) -> Tensor:
        """src_ids (batch, src_len), tgt_ids (batch, tgt_len), attention_mask of the source
        (batch, src_len; 1 = real token, else from ``pad_id``) -> logits (batch, tgt_len, V)."""
        if (isinstance(src_ids, Tensor) and isinstance(tgt_ids, Tensor) and not tracing()
                and src_ids.dim() >= 1 and tgt_ids.dim() >= 1 and len(src_ids) != len(tgt_ids)):
            raise InputError(f"src_ids has {len(src_ids)} rows but tgt_ids has {len(tgt_ids)}; "
                             "give one target row per source row.")
        memory, src_real = self.encode(src_ids, attention_mask)
        return self.decode(tgt_ids, memory, src_real)

    def new_cache(self, batch: int, like: Tensor) -> list[LayerCache]:
        """Empty per-layer caches (zero-length past) for ``batch`` rows, dtype/device of ``like``."""
        return self._empty_cache(self.decoder, batch, like)


class DecoderTransformer(TransformerModel):
    """Decoder-only language model: ``model(input_ids) -> logits`` (batch, len, vocab)."""

    architecture = "decoder"

    def __init__(self, config: ModelConfig, embed: Embedder, decoder: Stack, head: nn.Linear,
                 mask: AttentionMask) -> None:
        super().__init__(config)
        self.embed, self.decoder, self.head, self.mask = embed, decoder, head, mask

    @property
    def max_positions(self) -> int | None:
        return self.embed.positional.max_positions

    def step(self, input_ids: Tensor, real: Tensor, caches: list[LayerCache] | None = None,
             *, last_only: bool = False, positions: Tensor | None = None) -> Tensor:
        """Logits (batch, new_len, vocab) for tokens after the cached ones.

        Args:
            input_ids: (batch, new_len) tokens not yet in ``caches``.
            real: (batch, past_len + new_len) bool, True for real tokens (False: padding, a dropped draft).
            caches: per-layer caches, extended in place; None for an uncached call.
            last_only: return the logits of the last position only, (batch, 1, vocab).
            positions: (n,) int64 new positions whose logits alone are returned, (batch, n, vocab).
        """
        input_ids = check_token_ids(input_ids, self.config.vocab_size, "input_ids")
        inputs = self.decoder.attention_inputs(real, input_ids.shape[1], self.embed.positional,
                                               self.mask)
        x = self.decoder(self.embed(input_ids, inputs[0].q_positions), inputs, None, caches)
        x = x.index_select(1, positions) if positions is not None else x[:, -1:] if last_only else x
        return self.head(x)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """input_ids (batch, len), attention_mask (batch, len) 1 = real token (else padding is
        where ``pad_id`` is) -> logits (batch, len, vocab)."""
        input_ids = check_token_ids(input_ids, self.config.vocab_size, "input_ids")
        return self.step(input_ids, real_tokens(input_ids, attention_mask, self.config.pad_id))

    def new_cache(self, batch: int, like: Tensor) -> list[LayerCache]:
        """Empty per-layer caches (zero-length past) for ``batch`` rows, dtype/device of ``like``."""
        return self._empty_cache(self.decoder, batch, like)


class EncoderTransformer(TransformerModel):
    """Encoder-only model: ``model(input_ids) -> hidden states`` (batch, len, d_model), or
    logits (batch, len, vocab) when ``lm_head`` is configured. With ``pooling`` it also gives
    sentence embeddings (:meth:`sentence_embedding` of ids; ``model.embed(texts)``, which is
    :meth:`encode`, as ``OnnxModel.embed``); with ``classifier`` a cross-encoder's scores
    (:meth:`classify`, :meth:`score`, :meth:`rerank`)."""

    architecture = "encoder"

    def __init__(self, config: ModelConfig, embed: Embedder, encoder: Stack,
                 head: nn.Linear | None, mask: AttentionMask, *,
                 sentence_head: SentenceHead | None = None,
                 classifier: ClassifierHead | None = None) -> None:
        super().__init__(config)
        self.embed, self.encoder, self.head, self.mask = embed, encoder, head, mask
        self.sentence_head, self.classifier = sentence_head, classifier
        #: ``encode``/``embed``, ``score`` and ``rerank``, run through this model's batches.
        self.sentences = SentenceTasks(self)
        embed.sentences = self.encode  # model.embed(texts) gives sentence embeddings

    @property
    def max_positions(self) -> int | None:
        return self.embed.positional.max_positions

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                      token_type_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """input_ids (batch, len), attention_mask (batch, len) 1 = real token (else padding is
        where ``pad_id`` is), token_type_ids (batch, len) segment ids (a pair's second text: 1)
        -> last hidden states (batch, len, d_model), real (batch, len) bool."""
        input_ids = check_token_ids(input_ids, self.config.vocab_size, "input_ids")
        real = real_tokens(input_ids, attention_mask, self.config.pad_id)
        inputs = self.encoder.attention_inputs(real, input_ids.shape[1], self.embed.positional,
                                               self.mask)
        x = self.embed(input_ids, inputs[0].q_positions, token_type_ids)
        return self.encoder(x, inputs), real

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None) -> Tensor:
        """input_ids (batch, len), attention_mask (batch, len) 1 = real token (else padding is
        where ``pad_id`` is) -> hidden states (batch, len, d_model) or logits."""
        hidden, _ = self.hidden_states(input_ids, attention_mask, token_type_ids)
        return self.head(hidden) if self.head is not None else hidden

    def sentence_embedding(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                           pooling_mask: Tensor | None = None) -> Tensor:
        """(batch, len) ids and masks -> sentence embeddings (batch, dim). ``pooling_mask``
        (batch, len), 1 = pooled: the real tokens less the prompt (default: every real token)."""
        if self.sentence_head is None:
            raise InputError("This encoder has no sentence embedding; its config names no "
                             "'pooling'. Load a sentence-transformers folder, or add pooling.")
        hidden, real = self.hidden_states(input_ids, attention_mask)
        pooled = real if pooling_mask is None else real & (pooling_mask != 0)
        return self.sentence_head(hidden, pooled)

    def classify(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                 token_type_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(batch, len) ids, masks and segment ids -> (logits, scores), each (batch, num_labels)."""
        if self.classifier is None:
            raise InputError("This encoder has no classifier; its config names no 'classifier'. "
                             "Load a cross-encoder (a *ForSequenceClassification checkpoint).")
        hidden, _ = self.hidden_states(input_ids, attention_mask, token_type_ids)
        return self.classifier(hidden)

    # -- sentence tasks (SentenceTasks over this model's runs) ---------------------------------
    def embedding_settings(self) -> tuple[dict, int | None]:
        """The config as a dict, and the positional encoding's bound (or None)."""
        return self.config.to_dict(), self.max_positions

    def _tensors(self, *arrays: np.ndarray) -> list[Tensor]:
        device = next(self.parameters()).device
        return [torch.from_numpy(a).to(device) for a in arrays]

    def run_embedding(self, ids: np.ndarray, real: np.ndarray, pooled: np.ndarray) -> np.ndarray:
        """One padded batch: ids, real, pooled (batch, len) -> embeddings (batch, dim) float32,
        in eval mode without gradients (whatever mode the model is in), on the model's device."""
        with eval_mode(self), torch.inference_mode():  # no dropout
            out = self.sentence_embedding(*self._tensors(ids, real, pooled))
        return out.float().cpu().numpy()

    def run_scores(self, ids: np.ndarray, real: np.ndarray, types: np.ndarray) -> np.ndarray:
        """One padded batch: ids, real, token types (batch, len) -> scores (batch, num_labels)
        float32, as :meth:`run_embedding`."""
        segments = self.embed.positional.token_type_table() is not None  # BERT's types
        ids_t, real_t, types_t = self._tensors(ids, real, types)
        with eval_mode(self), torch.inference_mode():
            _, scores = self.classify(ids_t, real_t, types_t if segments else None)
        return scores.float().cpu().numpy()

    def encode(self, inputs: Any, *, normalize: bool | None = None, prompt_name: str | None = None,
               prompt: str | None = None, dimensions: int | None = None, batch_size: int = 32,
               max_batch_tokens: int | None = DEFAULT_BATCH_TOKENS) -> np.ndarray:
        """Sentence embeddings (n, dim) float32 of texts or token ids, as sentence-transformers'
        ``encode``: see :meth:`SentenceTasks.encode <transformer_kit.core.embedding.SentenceTasks.encode>`."""
        return self.sentences.encode(inputs, normalize=normalize, prompt_name=prompt_name,
                                     prompt=prompt, dimensions=dimensions, batch_size=batch_size,
                                     max_batch_tokens=max_batch_tokens)

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
