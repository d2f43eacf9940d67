"""The model config: validated with pydantic, read from a dict, YAML or JSON.

Every key is listed in :class:`ModelConfig`; unknown keys, out-of-range values and impossible
combinations raise :class:`ConfigError` naming the key and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from transformer_kit.core.component import KEY_KINDS, LAYER_KINDS, MODEL_KINDS
from transformer_kit.core.config_files import read_config_file
from transformer_kit.core.errors import ConfigError, did_you_mean
from transformer_kit.core.layer_types import layer_type_problems
from transformer_kit.core.sentence_config import Classifier, SentenceEmbedding, sentence_problems
from transformer_kit.core.speech_config import SpeechConfig

__all__ = ["ComponentSpec", "ModelConfig", "config_from_dict", "load_config", "read_config_file"]

Architecture = Literal["encoder_decoder", "encoder", "decoder"]


class ComponentSpec(BaseModel):
    """A component named in a config: ``"rotary"`` or ``{name: rotary, base: 500000}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_name_or_mapping(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"name": value}
        if isinstance(value, dict) and "params" not in value:
            rest = {k: v for k, v in value.items() if k != "name"}
            return {"name": value.get("name"), "params": rest}
        return value

    @model_serializer
    def _as_name_or_mapping(self) -> str | dict[str, Any]:
        return {"name": self.name, **self.params} if self.params else self.name

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        """What a config file may write: a name, or a mapping with the name and parameters."""
        return {
            "title": "Component",
            "description": "A registered component: its name, or {name: ..., <parameter>: ...}.",
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}},
                 "required": ["name"], "additionalProperties": True},
            ],
        }


class ModelConfig(BaseModel):
    """Everything needed to assemble a model. Defaults are the paper's (Vaswani et al., 2017).

    Sizes: ``d_model`` split into ``num_heads`` heads; ``num_kv_heads`` < num_heads gives
    grouped-query attention; ``num_layers`` per stack unless ``encoder_layers`` /
    ``decoder_layers`` say otherwise. Vocabulary: ``vocab_size`` shared, or ``src_vocab_size``
    and ``tgt_vocab_size`` (encoder_decoder only). Components: one entry per kind.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    architecture: Architecture = "encoder_decoder"
    vocab_size: int | None = Field(None, gt=0)
    src_vocab_size: int | None = Field(None, gt=0)
    tgt_vocab_size: int | None = Field(None, gt=0)
    d_model: int = Field(512, gt=0)
    num_heads: int = Field(8, gt=0)
    num_kv_heads: int | None = Field(None, gt=0)
    head_dim: int | None = Field(None, gt=0)
    num_layers: int = Field(6, gt=0)
    encoder_layers: int | None = Field(None, gt=0)
    decoder_layers: int | None = Field(None, gt=0)
    d_ff: int = Field(2048, gt=0)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    max_len: int = Field(512, gt=0)
    pad_id: int | None = Field(0, ge=0)
    bos_id: int | None = Field(1, ge=0)
    eos_id: int | list[int] | None = Field(
        2, description="The id that ends a generated sequence, or a list of them (a chat model's "
        "end of turn and its end of text); null: none.")
    forced_bos_id: int | None = Field(None, ge=0)
    tie_embeddings: bool = True
    scale_embeddings: bool = True
    attention_bias: bool = True
    attention_out_bias: bool | None = None
    embedding_norm: bool = False
    head_bias: bool = False
    lm_head: bool = False
    embedding_scale: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="Multiplies the token embeddings (Granite's "
        "embedding_multiplier); instead of scale_embeddings' sqrt(d_model); null: none.")
    logit_scale: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="Multiplies the output head's logits (Granite: "
        "1 / logits_scaling); null: none.")
    logit_softcap: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="Caps the output head's logits at +-cap: "
        "cap * tanh(logits / cap), after logit_scale (Gemma 2's final_logit_softcapping); null: none.")

    @model_validator(mode="after")
    def _scales(self) -> ModelConfig:
        """One scale of the embeddings; logit transforms only where there is a head."""
        if self.embedding_scale is not None:
            if self.scale_embeddings and "scale_embeddings" in self.model_fields_set:
                raise ValueError(
                    f"'embedding_scale' ({self.embedding_scale}) and 'scale_embeddings' true both "
                    "scale the token embeddings; give one (for both, set scale_embeddings false "
                    "and embedding_scale to their product)")
            object.__setattr__(self, "scale_embeddings", False)  # the default gives way
        has_head = self.architecture != "encoder" or self.lm_head
        for key in ("logit_scale", "logit_softcap"):
            if getattr(self, key) is not None and not has_head:
                raise ValueError(f"{key!r} applies to the output head's logits; an encoder has "
                                 "a head only with 'lm_head' true")
        return self

    attention: ComponentSpec = ComponentSpec(name="matmul")
    positional: ComponentSpec = ComponentSpec(name="sinusoidal")
    mask: ComponentSpec | None = None
    block: ComponentSpec = ComponentSpec(name="post_norm")
    feedforward: ComponentSpec = ComponentSpec(name="relu")
    norm: ComponentSpec = ComponentSpec(name="layernorm")
    qk_norm: ComponentSpec | None = Field(
        None, description="A norm of the self-attention queries and keys after their projections, "
        "before rotary (Qwen3, OLMo2); null: none.")
    layer_types: list[str] | None = Field(
        None, description="One variant name per layer of the self-attention stack (decoder and "
        "encoder models), each a key of layer_variants; null: every layer alike.")
    layer_variants: dict[str, dict[str, ComponentSpec]] = Field(
        default_factory=dict, description="Per variant name, the components that replace the "
        f"top-level ones in its layers (kinds: {', '.join(LAYER_KINDS)}); e.g. "
        "{local: {mask: {name: sliding_window, window: 512}}}.")
    frontend: ComponentSpec | None = Field(
        None, description="encoder_decoder: turns the source's features into the encoder's "
        "embeddings (audio_conv: Whisper's two Conv1d + GELU), instead of a token embedding; "
        "null: the source is token ids.")
    features: ComponentSpec | None = Field(
        None, description="With a frontend: turns a raw signal (16 kHz audio samples) into the "
        "frontend's features (log_mel: Whisper's log-mel spectrogram); null: features are given.")
    encoder_positional: ComponentSpec | None = Field(
        None, description="encoder_decoder: the encoder's positional encoding where it is not "
        "the decoder's (Whisper: fixed sinusoids in the encoder, learned in the decoder); null: "
        "positional.")
    speech: SpeechConfig | None = Field(
        None, description="A speech model's transcription settings (Whisper's special tokens, "
        "languages, suppressed tokens, alignment heads); null: not a speech model.")
    pooling: ComponentSpec | None = Field(
        None, description="Encoders: pools the last hidden states into a sentence embedding "
        "(cls, mean, max, mean_sqrt_len, weightedmean, lasttoken); null: none.")
    sentence_embedding: SentenceEmbedding | None = Field(
        None, description="What follows pooling: dense layers, normalize, prompts.")
    classifier: Classifier | None = Field(
        None, description="Encoders: a sequence-classification head (a cross-encoder's scores).")
    max_seq_length: int | None = Field(
        None, gt=0, description="Tokens per input of embed and rerank (longer ones are cut); "
        "null: max_len.")
    lowercase: bool = Field(False, description="Lower-case texts before tokenizing them "
                            "(sentence-transformers' do_lower_case).")

    @property
    def eos_ids(self) -> list[int]:
        """Every id that ends a generated sequence (``eos_id`` as a list)."""
        if self.eos_id is None:
            return []
        return list(self.eos_id) if isinstance(self.eos_id, list) else [self.eos_id]

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        problems = self._vocabulary_problems()
        if self.lm_head and self.architecture != "encoder":
            problems.append("'lm_head' applies to encoder models (decoders always have one)")
        problems += self._head_problems()
        problems += self._source_problems()
        if isinstance(self.eos_id, list) and not self.eos_id:
            problems.append("'eos_id' is an empty list; give null for no end id, or the ids")
        if not problems:
            problems += self._token_id_problems()
        problems += layer_type_problems(self)
        problems += sentence_problems(self.architecture, self.lm_head, self.pooling,
                                      self.sentence_embedding, self.classifier, self.d_model)
        if problems:
            raise ValueError("; ".join(problems))
        if self.mask is None:
            default = "none" if self.architecture == "encoder" else "causal"
            object.__setattr__(self, "mask", ComponentSpec(name=default))
        return self

    def _vocabulary_problems(self) -> list[str]:
        """The vocabulary keys the architecture does not take: one shared vocabulary or a source
        and a target one (encoder_decoder), one vocabulary and one stack (the others)."""
        problems = []
        arch = self.architecture
        if arch == "encoder_decoder":
            split = (self.src_vocab_size, self.tgt_vocab_size)
            if self.vocab_size is None and None in split:
                problems.append("give 'vocab_size', or both 'src_vocab_size' and 'tgt_vocab_size'")
            if self.vocab_size is not None and split != (None, None):
                problems.append("give either 'vocab_size' or 'src_vocab_size'/'tgt_vocab_size', not both")
            return problems
        if self.vocab_size is None:
            problems.append(f"'vocab_size' is required for architecture {arch!r}")
        for key in ("src_vocab_size", "tgt_vocab_size", "encoder_layers", "decoder_layers"):
            if getattr(self, key) is not None:
                problems.append(f"{key!r} applies to encoder_decoder only; use "
                                f"{'vocab_size' if 'vocab' in key else 'num_layers'}")
        return problems

    def _source_problems(self) -> list[str]:
        """Source components where there is no encoder-decoder source, features without a
        frontend to read them, a source vocabulary where the source is not tokens."""
        given = [key for key in ("frontend", "features", "encoder_positional", "speech")
                 if getattr(self, key) is not None]
        if self.architecture != "encoder_decoder":
            return [f"{key!r} applies to encoder_decoder only (the source of the encoder)"
                    for key in given]
        problems = []
        if self.features is not None and self.frontend is None:
            problems.append("'features' makes the features a 'frontend' reads; give the frontend "
                            "too (e.g. audio_conv after log_mel)")
        if self.speech is not None:
            if self.frontend is None:
                problems.append("'speech' settings need a 'frontend' (the audio's features)")
            problems += self.speech.token_problems(self.tgt_vocab, self.n_decoder_layers,
                                                   self.num_heads)
        if self.frontend is not None and self.src_vocab_size is not None:
            problems.append("'src_vocab_size' is the source's vocabulary, but with a 'frontend' "
                            "the source is features, not tokens; give 'vocab_size' (the target's)")
        return problems

    def _head_problems(self) -> list[str]:
        """d_model that the heads do not divide (without head_dim), kv heads that do not divide the heads."""
        problems = []
        if self.head_dim is None and self.d_model % self.num_heads:
            problems.append(f"'d_model' ({self.d_model}) must be divisible by 'num_heads' "
                            f"({self.num_heads}), or give 'head_dim'")
        kv = self.num_kv_heads
        if kv is not None and (kv > self.num_heads or self.num_heads % kv):
            problems.append(f"'num_kv_heads' ({kv}) must divide 'num_heads' ({self.num_heads})")
        return problems

    def _token_id_problems(self) -> list[str]:
        """Special token ids that are negative or outside their vocabulary (pad_id: both)."""
        problems = []
        for key in ("pad_id", "bos_id", "eos_id", "forced_bos_id"):
            value = getattr(self, key)
            vocab = self.src_vocab if key == "pad_id" else self.tgt_vocab
            limit = min(vocab, self.tgt_vocab) if key == "pad_id" else vocab
            for one in value if isinstance(value, list) else [value]:
                if one is not None and one < 0:
                    problems.append(f"{key!r} ({one}) must not be negative")
                elif one is not None and one >= limit:
                    problems.append(f"{key!r} ({one}) must be below the vocabulary size ({limit})")
        return problems

    def layer_component(self, kind: str, layer: int | None) -> ComponentSpec | None:
        """The spec of ``kind`` in self-attention layer ``layer`` (its variant's, else the
        top-level one); ``layer`` None: the top-level spec."""
        if layer is not None and self.layer_types is not None:
            spec = self.layer_variants[self.layer_types[layer]].get(kind)
            if spec is not None:
                return spec
        return self.component(kind)

    def variant_components(self) -> dict[str, dict[str, ComponentSpec]]:
        """The components each layer variant replaces, by variant name (empty: none vary)."""
        return {name: dict(kinds) for name, kinds in self.layer_variants.items()}

    # -- resolved values -------------------------------------------------------------------
    @property
    def src_vocab(self) -> int:
        return self.src_vocab_size or self.vocab_size  # type: ignore[return-value]

    @property
    def tgt_vocab(self) -> int:
        return self.tgt_vocab_size or self.vocab_size  # type: ignore[return-value]

    @property
    def shared_vocab(self) -> bool:
        return self.vocab_size is not None

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def attention_head_dim(self) -> int:
        """Each attention head's width: ``head_dim``, or d_model // num_heads."""
        return self.head_dim or self.d_model // self.num_heads

    @property
    def n_encoder_layers(self) -> int:
        return self.encoder_layers or self.num_layers

    @property
    def n_decoder_layers(self) -> int:
        return self.decoder_layers or self.num_layers

    def component(self, key: str) -> ComponentSpec | None:
        """The spec the config key ``key`` names (a kind, or ``encoder_positional``; None: an
        optional one left out)."""
        return getattr(self, key)

    def components(self) -> dict[str, ComponentSpec]:
        """The spec of every component the model is assembled from, by config key (a kind, or
        one of :data:`KEY_KINDS`: its kind there), the optional ones left out."""
        keys = (*MODEL_KINDS, *KEY_KINDS)
        return {key: spec for key in keys if (spec := getattr(self, key)) is not None}

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON/YAML-ready) that validates back to an equal config."""
        return self.model_dump(mode="json")


def _format_validation_error(exc: ValidationError) -> str:
    allowed = list(ModelConfig.model_fields)
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "config"
        if err["type"] == "extra_forbidden":
            key = str(err["loc"][-1])
            fields = allowed if len(err["loc"]) == 1 else ["name", "params"]
            lines.append(f"unknown key {loc!r}.{did_you_mean(key, fields)} "
                         f"Allowed keys: {', '.join(fields)}")
        elif err["loc"] and err["loc"][0] in (*MODEL_KINDS, *KEY_KINDS) and len(err["loc"]) == 1:
            lines.append(f"key {loc!r}: give a component name or a mapping "
                         f"{{name: ..., <params>}} (given {err.get('input')!r})")
        elif err["type"] == "value_error":
            lines.append(str(err["msg"]).removeprefix("Value error, "))
        else:
            given = err.get("input")
            lines.append(f"key {loc!r}: {err['msg']} (given {given!r})")
    return "Invalid model config: " + "; ".join(lines) + "."


def config_from_dict(data: Any) -> ModelConfig:
    """Validate a mapping into a :class:`ModelConfig`; raises :class:`ConfigError`."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"A model config is a mapping of keys to values; got {type(data).__name__}. "
            "See README's config example."
        )
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


def load_config(source: ModelConfig | dict[str, Any] | str | Path) -> ModelConfig:
    """A :class:`ModelConfig` from a config, a dict, or a path to a YAML/JSON file."""
    if isinstance(source, ModelConfig):
        return source
    if isinstance(source, (str, Path)):
        return config_from_dict(read_config_file(source))
    return config_from_dict(source)
