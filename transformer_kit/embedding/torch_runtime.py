"""The PyTorch encoder's side of :class:`~transformer_kit.embedding.Embeds`: padded numpy
batches through ``sentence_embedding`` and ``classify``, in eval mode without gradients
(whatever mode the model is in), on the model's device."""

from __future__ import annotations

import numpy as np
import torch

from transformer_kit.decoding.torch_steps import eval_mode
from transformer_kit.embedding.api import Embeds


class TorchEmbeds(Embeds):
    """``embed``/``encode``, ``score`` and ``rerank`` for an ``EncoderTransformer`` (which
    provides ``config``, ``max_positions``, ``sentence_embedding`` and ``classify``)."""

    def embedding_settings(self) -> tuple[dict, int | None]:
        return self.config.to_dict(), self.max_positions

    def _tensors(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        device = next(self.parameters()).device
        return [torch.from_numpy(a).to(device) for a in arrays]

    def run_embedding(self, ids: np.ndarray, keep: np.ndarray, pooled: np.ndarray) -> np.ndarray:
        with eval_mode(self), torch.inference_mode():  # no dropout
            out = self.sentence_embedding(*self._tensors(ids, keep, pooled))
        return out.float().cpu().numpy()

    def run_scores(self, ids: np.ndarray, keep: np.ndarray, types: np.ndarray) -> np.ndarray:
        segments = getattr(self.embed.positional, "token_type", None) is not None  # BERT's types
        ids_t, keep_t, types_t = self._tensors(ids, keep, types)
        with eval_mode(self), torch.inference_mode():
            _, scores = self.classify(ids_t, keep_t, types_t if segments else None)
        return scores.float().cpu().numpy()
