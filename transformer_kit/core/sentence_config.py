"""The config of an encoder's sentence outputs: the sentence embedding after ``pooling`` (its
dense layers, normalisation and prompts, as a sentence-transformers folder holds them) and the
sequence-classification head of a cross-encoder."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Activations a dense layer or a classifier may end with (sentence-transformers' torch.nn names
#: map onto these: Tanh -> tanh, Identity -> identity, Sigmoid -> sigmoid, ...).
Activation = Literal["identity", "tanh", "sigmoid", "relu", "gelu", "silu", "softmax"]


class DenseLayer(BaseModel):
    """One sentence-transformers ``Dense`` layer: ``activation(x @ W^T + b)`` on the sentence
    embedding (weights ``sentence_head.dense.{i}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    in_features: int = Field(gt=0)
    out_features: int = Field(gt=0)
    bias: bool = True
    activation: Activation = "tanh"


class SentenceEmbedding(BaseModel):
    """What follows ``pooling``: dense layers, L2 normalisation and the prompts."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    dense: list[DenseLayer] = Field(default_factory=list, description="Dense layers after pooling.")
    normalize: bool = Field(False, description="L2-normalise the embedding (a Normalize module).")
    include_prompt: bool = Field(True, description="Pool the prompt's tokens too (false: only "
                                 "the text's; INSTRUCTOR-style models).")
    prompts: dict[str, str] = Field(default_factory=dict, description="Named prompts put before "
                                    "the text (config_sentence_transformers.json's).")
    default_prompt_name: str | None = Field(None, description="The prompt used when none is named.")
    similarity: Literal["cosine", "dot", "euclidean", "manhattan"] = "cosine"

    @model_validator(mode="after")
    def _consistent(self) -> SentenceEmbedding:
        name = self.default_prompt_name
        if name is not None and name not in self.prompts:
            raise ValueError(f"'sentence_embedding.default_prompt_name' {name!r} is not one of the "
                             f"prompts ({', '.join(self.prompts) or 'none'}); add it to 'prompts'")
        for i, (before, after) in enumerate(zip(self.dense, self.dense[1:], strict=False)):
            if after.in_features != before.out_features:
                raise ValueError(f"'sentence_embedding.dense' layer {i + 1} takes {after.in_features} "
                                 f"features but layer {i} gives {before.out_features}")
        return self


class Classifier(BaseModel):
    """A sequence-classification head (BERT's pooler and classifier, RoBERTa's classification
    head): ``out(pooler_activation(pooler(h[:, 0])))`` -> logits (batch, num_labels); scores
    are ``activation(logits)`` (sentence-transformers' CrossEncoder reads sigmoid for one label,
    identity for more)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    num_labels: int = Field(1, gt=0)
    pooler_activation: Activation = "tanh"
    activation: Activation | None = Field(None, description="Scores from logits; null: sigmoid "
                                          "for one label, identity for more.")
    labels: list[str] | None = Field(None, description="A name per label (id2label), or null.")

    @property
    def score_activation(self) -> str:
        """The activation that turns logits into scores."""
        if self.activation is not None:
            return self.activation
        return "sigmoid" if self.num_labels == 1 else "identity"

    @model_validator(mode="after")
    def _consistent(self) -> Classifier:
        if self.labels is not None and len(self.labels) != self.num_labels:
            raise ValueError(f"'classifier.labels' names {len(self.labels)} labels but "
                             f"'num_labels' is {self.num_labels}")
        return self


def sentence_problems(architecture: str, lm_head: bool, pooling: object,
                      sentence: SentenceEmbedding | None, classifier: Classifier | None,
                      d_model: int) -> list[str]:
    """Why the sentence outputs of a config cannot be built (empty: they can)."""
    problems: list[str] = []
    named = [key for key, value in (("pooling", pooling), ("sentence_embedding", sentence),
                                    ("classifier", classifier)) if value is not None]
    if named and architecture != "encoder":
        problems.append(f"{', '.join(repr(k) for k in named)} apply to encoder models only "
                        f"(architecture is {architecture!r})")
    if pooling is not None and classifier is not None:
        problems.append("'pooling' (a sentence embedding) and 'classifier' (scores) exclude each "
                        "other; an encoder exports one head")
    if sentence is not None and pooling is None:
        problems.append("'sentence_embedding' follows pooling; name a 'pooling' component "
                        "(cls, mean, max, ...) too")
    if lm_head and (pooling is not None or classifier is not None):
        problems.append("'lm_head' and a sentence output ('pooling' or 'classifier') exclude "
                        "each other; an encoder exports one head")
    if sentence is not None and sentence.dense and sentence.dense[0].in_features != d_model:
        problems.append(f"'sentence_embedding.dense' layer 0 takes {sentence.dense[0].in_features} "
                        f"features but pooling gives d_model ({d_model})")
    return problems
