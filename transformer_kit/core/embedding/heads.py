"""An encoder's sentence outputs: the sentence embedding (pooling, dense layers, normalisation;
sentence-transformers' ``Pooling``, ``Dense``, ``Normalize``) and a cross-encoder's
sequence-classification head. Both are plain modules exported inside the model's graph."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from transformer_kit.core.sentence_config import Classifier, SentenceEmbedding

#: The config's activation names -> modules.
ACTIVATIONS: dict[str, type[nn.Module]] = {
    "identity": nn.Identity, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "relu": nn.ReLU,
    "gelu": nn.GELU, "silu": nn.SiLU,
}


def activation(name: str) -> nn.Module:
    """The module of an activation name (``softmax`` over the last axis)."""
    return nn.Softmax(dim=-1) if name == "softmax" else ACTIVATIONS[name]()


class DenseActivation(nn.Module):
    """``activation(linear(x))``: (batch, in) -> (batch, out)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, act: str) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.activation = activation(act)

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(linear_as_matmul(self.linear, x))


def linear_as_matmul(linear: nn.Linear, x: Tensor) -> Tensor:
    """``linear(x)`` for x (batch, in), computed on (batch, 1, in) so that it exports as ONNX
    MatMul and Add, which int8 and int4 quantize like every other product (a 2-D input exports
    as Gemm, whose per-channel int8 quantization onnxruntime's quantizer gets wrong)."""
    return linear(x[:, None])[:, 0]


class SentenceHead(nn.Module):
    """hidden (batch, len, d_model), real (batch, len) bool -> sentence embedding (batch, dim).

    Args:
        pooling: the registry's ``pooling`` component.
        config: the dense layers and whether to normalise.
    """

    def __init__(self, pooling: nn.Module, config: SentenceEmbedding) -> None:
        super().__init__()
        self.pooling = pooling
        self.dense = nn.ModuleList(DenseActivation(d.in_features, d.out_features, d.bias, d.activation)
                                   for d in config.dense)
        self.normalize = config.normalize

    def forward(self, hidden: Tensor, real: Tensor) -> Tensor:
        x = self.pooling(hidden, real)
        for layer in self.dense:
            x = layer(x)
        # sentence-transformers' Normalize: x / max(||x||, 1e-12)
        return F.normalize(x, p=2.0, dim=-1) if self.normalize else x


class ClassifierHead(nn.Module):
    """hidden (batch, len, d_model) -> (logits, scores), each (batch, num_labels): the first
    token through ``pooler`` and its activation, then ``out``; scores = the score activation of
    the logits."""

    def __init__(self, d_model: int, config: Classifier) -> None:
        super().__init__()
        self.pooler = nn.Linear(d_model, d_model)
        self.pooler_activation = activation(config.pooler_activation)
        self.out = nn.Linear(d_model, config.num_labels)
        self.score = activation(config.score_activation)

    def forward(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        pooled = self.pooler_activation(linear_as_matmul(self.pooler, hidden[:, 0]))
        logits = linear_as_matmul(self.out, pooled)
        return logits, self.score(logits.to(torch.float32)).to(logits.dtype)


def sentence_outputs(d_model: int, pooling: nn.Module | None, sentence: SentenceEmbedding | None,
                     classifier: Classifier | None) -> dict[str, nn.Module | None]:
    """An encoder's ``sentence_head`` (with the registry's ``pooling``) and ``classifier``, as
    its config's ``sentence_embedding`` and ``classifier`` ask (None where they do not)."""
    head = SentenceHead(pooling, sentence or SentenceEmbedding()) if pooling is not None else None
    return {"sentence_head": head,
            "classifier": ClassifierHead(d_model, classifier) if classifier else None}
