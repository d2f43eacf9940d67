"""``build_model``: a config in, a ``torch.nn.Module`` out, every part from the registry.

Before any weight is allocated the whole model is assembled once on PyTorch's ``meta`` device
(shapes only, no memory): that checks every component's parameters exactly as the real build
does (``check_config``, also behind ``transformer-kit config validate``) and counts the
parameters, so a config whose weights cannot fit in memory is refused with its size.
``load_model`` builds a model saved with ``model.save`` again.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from transformer_kit.core.attention import MultiHeadAttention
from transformer_kit.core.capabilities import check_capabilities
from transformer_kit.core.component import KEY_KINDS
from transformer_kit.core.config import ModelConfig, load_config
from transformer_kit.core.embedding.heads import sentence_outputs
from transformer_kit.core.errors import ComponentError, ConfigError, TransformerKitError
from transformer_kit.core.interfaces import AttentionKernel, AttentionMask, Block, PositionalEncoding
from transformer_kit.core.masks import NoMask
from transformer_kit.core.memory import available_memory
from transformer_kit.core.model import (
    DecoderTransformer,
    EncoderDecoderTransformer,
    EncoderTransformer,
    TransformerModel,
)
from transformer_kit.core.registry import Registry, get_registry, origin
from transformer_kit.core.stacks import Embedder, FeatureEmbedder, LayerVariants, OutputHead, Stack

#: The type each kind's factory must return.
_EXPECTED: dict[str, type | tuple[type, ...]] = {
    "attention": nn.Module,
    "positional": PositionalEncoding,
    "mask": AttentionMask,
    "block": Block,
    "feedforward": nn.Module,
    "norm": nn.Module,
    "qk_norm": nn.Module,
    "pooling": nn.Module,
    "frontend": nn.Module,
    "features": nn.Module,
}


class _Parts:
    """Creates the config's components from the registry, naming the slot when one fails."""

    def __init__(self, config: ModelConfig, registry: Registry) -> None:
        self.config = config
        self.registry = registry
        self.context: dict[str, Any] = {
            "d_model": config.d_model,
            "num_heads": config.num_heads,
            "num_kv_heads": config.kv_heads,
            "head_dim": config.attention_head_dim,
            "d_ff": config.d_ff,
            "dropout": config.dropout,
            "max_len": config.max_len,
        }

    def create(self, kind: str, slot: str, *, layer: int | None = None, key: str | None = None,
               **extra: Any) -> Any:
        """The component of ``kind`` (of self-attention layer ``layer``'s variant, if any; or
        the one config key ``key`` names)."""
        spec = self.config.component(key) if key is not None else self.config.layer_component(kind, layer)
        entry = self.registry.entry(kind, spec.name)
        try:
            obj = self.registry.create(kind, spec.name, context={**self.context, **extra},
                                       **spec.params)
        except TransformerKitError as exc:
            raise type(exc)(f"{slot}: {exc}") from exc
        expected = _EXPECTED[kind]
        if not isinstance(obj, expected):
            raise ComponentError(
                f"{slot}: the factory of {kind} {spec.name!r} "
                f"({origin(entry.plugin, entry.distribution)}) returned "
                f"{type(obj).__name__}; a {kind} component must return a "
                f"{getattr(expected, '__name__', expected)}."
            )
        return obj

    def attention(self, slot: str, *, is_cross: bool, layer: int | None = None) -> MultiHeadAttention:
        own = None if is_cross else layer  # layer variants replace self-attention's parts only
        kernel: AttentionKernel = self.create("attention", f"{slot}.kernel", layer=own)
        qk_norm = None if is_cross or self.config.qk_norm is None else self.create(
            "qk_norm", f"{slot}.qk_norm", layer=own)
        return MultiHeadAttention(self.config.d_model, self.config.num_heads, self.config.kv_heads,
                                  kernel, is_cross=is_cross, bias=self.config.attention_bias,
                                  out_bias=self.config.attention_out_bias,
                                  head_dim=self.config.attention_head_dim, qk_norm=qk_norm)

    def stack(self, role: str, num_layers: int, *, cross: bool) -> Stack:
        varies = self.config.layer_types is not None and not cross
        layers = []
        for i in range(num_layers):
            slot, layer = f"{role} layer {i}", i if varies else None
            layers.append(self.create(
                "block", slot, role=role,
                self_attention=self.attention(f"{slot}.self_attention", is_cross=False, layer=layer),
                cross_attention=self.attention(f"{slot}.cross_attention", is_cross=True)
                if cross else None,
                feedforward=self.create("feedforward", f"{slot}.feedforward", layer=layer),
                make_norm=self.norm_factory(f"{slot}.norm", layer),
            ))
        final = self.create("norm", f"{role}.final_norm") if layers[0].needs_final_norm else None
        return Stack(layers, final, self.variants(role) if varies else None)

    def check_replaced(self) -> None:
        """Create each top-level component that every layer variant replaces (and so no layer
        builds): its name and parameters are then checked as the used ones are, and a typo in
        it is an error rather than silently ignored."""
        types = self.config.layer_types
        if types is None:
            return
        variants = self.config.variant_components()
        for kind in ("attention", "feedforward", "norm", "qk_norm"):
            if self.config.component(kind) is not None and all(kind in variants.get(name, {})
                                                                 for name in set(types)):
                self.create(kind, f"config key {kind!r} (every layer variant replaces it)", key=kind)

    def variants(self, role: str) -> LayerVariants:
        """The masks and positional encodings the layer variants replace."""
        masks: dict[str, AttentionMask | None] = {}
        positionals: dict[str, PositionalEncoding | None] = {}
        types = self.config.layer_types
        for name, kinds in self.config.variant_components().items():
            slot, layer = f"{role} layer_variants.{name}", types.index(name)
            masks[name] = self.create("mask", f"{slot}.mask", layer=layer) if "mask" in kinds else None
            positional = None if "positional" not in kinds else self.create(
                "positional", f"{slot}.positional", layer=layer,
                causal=self.config.architecture == "decoder")
            if positional is not None and type(positional).embed is not PositionalEncoding.embed:
                raise ConfigError(
                    f"{slot}: positional {kinds['positional'].name!r} adds to the embeddings, "
                    "which all layers share; a layer variant's positional encoding may only "
                    "rotate q and k or bias the scores (rotary, alibi, relative_bias, none).")
            positionals[name] = positional
        return LayerVariants(types, masks, positionals)

    def norm_factory(self, slot: str, layer: int | None = None) -> Callable[[], nn.Module]:
        return lambda: self.create("norm", slot, layer=layer)

    def embedder(self, token: nn.Embedding, slot: str, *, causal: bool,
                 key: str = "positional") -> Embedder:
        """Token embedding and the positional component config key ``key`` names; ``causal``:
        whether its stack attends only backwards (decoders), for encodings that differ by
        direction."""
        positional = self.create("positional", slot, causal=causal, key=key)
        side = slot.rpartition(".")[0] or "embedding"
        norm = self.create("norm", f"{side}.embedding_norm") if self.config.embedding_norm else None
        cfg = self.config
        scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else cfg.embedding_scale or 1.0
        return Embedder(token, positional, cfg.dropout, scale, norm)

    def feature_embedder(self) -> FeatureEmbedder:
        """The frontend, the encoder's positional encoding (``encoder_positional``, else
        ``positional``) and the features component, if any."""
        cfg = self.config
        key = "encoder_positional" if cfg.encoder_positional is not None else "positional"
        positional = self.create("positional", f"encoder.{key}", key=key, causal=False)
        features = self.create("features", "features") if cfg.features is not None else None
        return FeatureEmbedder(self.create("frontend", "frontend"), positional, cfg.dropout, features)

    def token_embedding(self, vocab: int) -> nn.Embedding:
        embedding = nn.Embedding(vocab, self.config.d_model)
        nn.init.normal_(embedding.weight, std=self.config.d_model ** -0.5)
        return embedding

    def head(self, vocab: int, tied: nn.Embedding | None) -> OutputHead:
        cfg = self.config
        head = OutputHead(cfg.d_model, vocab, cfg.head_bias, cfg.logit_scale, cfg.logit_softcap)
        if head.bias is not None:
            nn.init.zeros_(head.bias)
        if tied is not None:
            head.weight = tied.weight
        return head


@dataclass(frozen=True)
class ModelSize:
    """What a config's weights take: parameters (tied ones once), bytes in float32, and the
    largest tensor's name and shape."""

    parameters: int
    bytes: int
    largest: tuple[str, tuple[int, ...]]

    def __str__(self) -> str:
        name, shape = self.largest
        return (f"{self.parameters:,} parameters ({_size(self.bytes)} in float32; the largest "
                f"tensor is {name} {' x '.join(map(str, shape))})")


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if nbytes < 1000 or unit == "PB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1000
    raise AssertionError("unreachable")


def check_config(config: ModelConfig | dict | str | Path,
                 registry: Registry | None = None) -> ModelSize | None:
    """Everything :func:`build_model` checks, without allocating a weight: component names,
    their combination, and every component's parameters (the model is assembled on the ``meta``
    device, so each factory sees exactly what the real build gives it).

    Returns the model's size, or None when a plugin's factory cannot run on the meta device
    (it raised something other than a config error there; the real build will tell).
    Raises :class:`ConfigError` (or :class:`UnknownComponentError`) naming the key.
    """
    config = load_config(config)
    registry = registry or get_registry()
    named = [(key, KEY_KINDS.get(key, key), spec) for key, spec in config.components().items()]
    named += [(f"layer_variants.{name}.{kind}", kind, spec)
              for name, kinds in config.variant_components().items() for kind, spec in kinds.items()]
    for key, kind, spec in named:
        try:
            registry.entry(kind, spec.name)
        except ConfigError as exc:
            raise type(exc)(f"config key {key!r}: {exc}") from None
    check_capabilities(config, registry)
    try:
        with torch.device("meta"):
            model = _assemble(config, registry)
            _Parts(config, registry).check_replaced()
    except ComponentError:
        return None
    params = {id(p): (n, p) for n, p in model.named_parameters()}.values()
    name, largest = max(params, key=lambda item: item[1].numel())
    return ModelSize(sum(p.numel() for _, p in params), sum(p.numel() * 4 for _, p in params),
                     (name, tuple(largest.shape)))


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """While active, every parameter a module registers moves to the ``meta`` device as it is
    registered (buffers stay real: rotary frequencies and position tables are computed)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def build_model(config: ModelConfig | dict | str | Path,
                registry: Registry | None = None, *, empty: bool = False) -> TransformerModel:
    """Assemble a model from a config (a :class:`ModelConfig`, a dict, or a YAML/JSON path).

    ``empty``: parameters on the ``meta`` device (shapes only, no memory), for weights that
    come later (``from_hf`` fills or streams them); buffers are computed as usual.

    Raises :class:`ConfigError` (or :class:`UnknownComponentError`) naming the key or the
    component when the config cannot be built, and before allocating when its weights need
    more memory than the machine has available.
    """
    config = load_config(config)
    registry = registry or get_registry()
    size = check_config(config, registry)
    memory = available_memory()
    if not empty and size is not None and memory is not None and size.bytes > memory:
        raise ConfigError(
            f"This config needs {size}, more than the {_size(memory)} of memory available here. "
            "Make vocab_size, d_model, d_ff or the number of layers smaller."
        )
    with _parameters_on_meta() if empty else contextlib.nullcontext():
        model = _assemble(config, registry)
    model.components = {key: registry.entry(KEY_KINDS.get(key, key), spec.name)
                        for key, spec in config.components().items()}
    model.layer_components = {name: {kind: registry.entry(kind, spec.name) for kind, spec in kinds.items()}
                              for name, kinds in config.variant_components().items()}
    return model


def _assemble(config: ModelConfig, registry: Registry) -> TransformerModel:
    parts = _Parts(config, registry)
    mask: AttentionMask = parts.create("mask", "mask")
    arch = config.architecture
    if arch == "encoder_decoder":
        src_embed: Embedder | FeatureEmbedder
        if config.frontend is not None:
            tgt_token = parts.token_embedding(config.tgt_vocab)
            src_embed = parts.feature_embedder()
        else:
            src_token = parts.token_embedding(config.src_vocab)
            share = config.tie_embeddings and config.shared_vocab
            tgt_token = src_token if share else parts.token_embedding(config.tgt_vocab)
            key = "encoder_positional" if config.encoder_positional is not None else "positional"
            src_embed = parts.embedder(src_token, f"encoder.{key}", causal=False, key=key)
        return EncoderDecoderTransformer(
            config,
            src_embed=src_embed,
            tgt_embed=parts.embedder(tgt_token, "decoder.positional", causal=True),
            encoder=parts.stack("encoder", config.n_encoder_layers, cross=False),
            decoder=parts.stack("decoder", config.n_decoder_layers, cross=True),
            head=parts.head(config.tgt_vocab, tgt_token if config.tie_embeddings else None),
            encoder_mask=NoMask(),
            decoder_mask=mask,
        )
    token = parts.token_embedding(config.vocab_size)
    embed = parts.embedder(token, "positional", causal=arch == "decoder")
    tied = token if config.tie_embeddings else None
    if arch == "decoder":
        decoder = parts.stack("decoder", config.num_layers, cross=False)
        return DecoderTransformer(config, embed, decoder, parts.head(config.vocab_size, tied), mask)
    encoder = parts.stack("encoder", config.num_layers, cross=False)
    head = parts.head(config.vocab_size, tied) if config.lm_head else None
    pooling = parts.create("pooling", "pooling") if config.pooling is not None else None
    return EncoderTransformer(config, embed, encoder, head, mask, **sentence_outputs(
        config.d_model, pooling, config.sentence_embedding, config.classifier))
