"""Greedy decoding, cached (one new token per step, O(length) each) or uncached (reference)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from transformer_kit.errors import ConfigError, InputError
from transformer_kit.inputs import check_positions, check_token_ids
from transformer_kit.masks import keep_mask


def left_align(ids: Tensor, pad_id: int | None) -> tuple[Tensor, Tensor]:
    """Move each row's padding to the left, keeping token order.

    Args:
        ids: (batch, len) prompts padded with ``pad_id`` on either side.
    Returns:
        ids and keep (batch, len'), left-padded, with columns that are padding in every row
        dropped; keep is True for real tokens.
    """
    keep = keep_mask(ids, pad_id)
    order = torch.argsort(keep.to(torch.int8), dim=1, stable=True)
    ids, keep = ids.gather(1, order), keep.gather(1, order)
    first = int(keep.any(dim=0).long().argmax())
    return ids[:, first:], keep[:, first:]


def greedy_loop(next_logits: Callable[[Tensor | None], Tensor], batch: int, max_new_tokens: int,
                eos_id: int | None, fill_id: int, device: torch.device) -> Tensor:
    """Pick the most likely token until every row has emitted ``eos_id`` or the budget is spent.

    Args:
        next_logits: called with None for the prompt, then with the tokens just chosen
            (batch,); returns the next-token logits (batch, vocab).
    Returns:
        (batch, steps) int64, steps <= max_new_tokens; after its ``eos_id`` a row holds
        ``fill_id`` (with no ``eos_id``, every row runs to ``max_new_tokens``).
    """
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    chosen: list[Tensor] = []
    if max_new_tokens == 0:
        return torch.empty(batch, 0, dtype=torch.long, device=device)
    logits = next_logits(None)
    for step in range(max_new_tokens):
        token = torch.where(finished, fill_id, logits.argmax(dim=-1))
        chosen.append(token)
        if eos_id is not None:
            finished = finished | (token == eos_id)
        if step + 1 == max_new_tokens or bool(finished.all()):
            break
        logits = next_logits(token)
    return torch.stack(chosen, dim=1)


def _check_budget(max_new_tokens: object) -> int:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}.")
    return max_new_tokens


def _decoder_steps(model, ids: Tensor, use_cache: bool) -> Callable[[Tensor | None], Tensor]:
    cfg = model.config
    ids, keep = left_align(ids, cfg.pad_id)
    empty_rows = (~keep.any(dim=1)).nonzero().flatten().tolist()
    if empty_rows:
        raise InputError(f"Prompt rows {empty_rows} hold only padding (pad_id={cfg.pad_id}); "
                         "give every row at least one token.")
    caches = model.new_cache(ids.shape[0], model.head.weight) if use_cache else None
    state = {"ids": ids, "keep": keep}

    def next_logits(token: Tensor | None) -> Tensor:
        if token is None:
            new = state["ids"]  # the whole prompt
        else:
            state["keep"] = torch.cat([state["keep"], state["keep"].new_ones(len(token), 1)], 1)
            new = token[:, None]
            if not use_cache:  # the reference recomputes the whole sequence
                new = state["ids"] = torch.cat([state["ids"], new], 1)
        return model.step(new, state["keep"], caches, last_only=True)[:, -1]

    return next_logits


def _encoder_decoder_steps(model, src_ids: Tensor, use_cache: bool
                           ) -> Callable[[Tensor | None], Tensor]:
    memory, src_keep = model.encode(src_ids)
    batch = src_ids.shape[0]
    caches = model.new_cache(batch, memory) if use_cache else None
    state = {"tgt": torch.full((batch, 1), model.config.bos_id, device=src_ids.device)}

    def next_logits(token: Tensor | None) -> Tensor:
        if token is None:
            new = state["tgt"]  # bos
        else:
            new = token[:, None]
            if not use_cache:  # the reference recomputes the whole sequence
                new = state["tgt"] = torch.cat([state["tgt"], new], 1)
        return model.decode(new, memory, src_keep, caches, last_only=True)[:, -1]

    return next_logits


@torch.no_grad()
def generate(model, ids: Tensor, max_new_tokens: int = 32, *, use_cache: bool = True) -> Tensor:
    """Greedy decoding.

    Decoder models continue each prompt row (padded with ``pad_id`` on either side); encoder-
    decoder models encode ``ids`` once and decode from ``bos_id``. Each row stops at
    ``eos_id`` (included) and is filled with ``pad_id`` (or ``eos_id`` when there is no pad)
    afterwards; generation ends when all rows stopped or after ``max_new_tokens``.
    The model runs in eval mode for the call (dropout off) and returns to its mode after.

    Args:
        ids: (batch, len) int64 prompts (decoder) or source ids (encoder_decoder).
        use_cache: False recomputes the whole sequence each step (the reference).
    Returns:
        (batch, steps) int64: the new tokens only, steps <= max_new_tokens.
    """
    cfg = model.config
    max_new_tokens = _check_budget(max_new_tokens)
    if model.architecture == "encoder":
        raise InputError("generate needs a decoder; this model's architecture is 'encoder'.")
    if use_cache and model.uncacheable:
        raise InputError(
            f"{', '.join(model.uncacheable)} does not support the key/value cache, so cached "
            "decoding would not match the model; call generate(..., use_cache=False)."
        )
    is_decoder = model.architecture == "decoder"
    if not is_decoder and cfg.bos_id is None:
        raise ConfigError("bos_id is null, but encoder_decoder decoding starts from bos_id; set "
                          "bos_id in the config (for a checkpoint: tk.from_hf(folder, bos_id=...)).")
    vocab = cfg.vocab_size if is_decoder else cfg.src_vocab
    ids = check_token_ids(ids, vocab, "input_ids" if is_decoder else "src_ids")
    if is_decoder:
        longest = int(keep_mask(ids, cfg.pad_id).sum(dim=1).max())
        check_positions(longest + max_new_tokens, model.max_positions, "prompt + max_new_tokens")
    else:
        check_positions(1 + max_new_tokens, model.max_positions, "bos + max_new_tokens")
    fill = next((i for i in (cfg.pad_id, cfg.eos_id) if i is not None), 0)
    was_training = model.training
    model.eval()
    try:
        build_steps = _decoder_steps if is_decoder else _encoder_decoder_steps
        steps = build_steps(model, ids, use_cache)
        return greedy_loop(steps, ids.shape[0], max_new_tokens, cfg.eos_id, fill, ids.device)
    finally:
        model.train(was_training)
