"""The built-in ``grammar`` logits processor: each row's reply held to an llguidance grammar
(a JSON schema, a regular expression, a Lark grammar, a list of choices; see
:mod:`transformer_kit.core.decoding.response_format`).

Every row has its own matcher: it reads the row's last token each step and allows only the
tokens that keep the text inside the grammar (the end ids once the grammar is complete, and only
they once it cannot go on). The same numpy masks apply whatever runtime made the scores.

A reply must also end within ``max_new_tokens``. Each row's shortest way to a complete reply is
traced ahead on a copy of its matcher (closing quotes and brackets first, then the shortest
tokens), from the first token on: again each :data:`CLOSING_EVERY` tokens once the budget left
nears that way's length, and while the budget is far from it, after a quarter of the tokens to
spare (a token can lengthen the way out, by opening an object of required keys, but seldom by
more than that). When the way out needs all the tokens left, its next token is the one taken;
when it is close to that (:data:`CLOSING_SLACK`), the row may only take tokens after which a way
out still fits. So even a model that would write a string or a number for ever gives text that
parses, closed where the budget runs out, however long the shortest reply (a dozen required
keys) is.
"""

from __future__ import annotations

import numpy as np

from transformer_kit.core.decoding import DecodingState, LogitsProcessor
from transformer_kit.core.decoding.response_format import guidance_tokenizer
from transformer_kit.core.errors import InputError

NEVER = -np.inf
#: In this many of the last tokens of the budget, a way out that does not reach an end id (the
#: tracing found none) is taken anyway.
CLOSING_WINDOW = 64
#: Within this many tokens of the last moment to close, only tokens that keep a way out are
#: allowed (one token can lengthen the way out: a multi-byte character, an opened object).
CLOSING_SLACK = 16
#: ... and of those, the model's best are checked, in order: the first that fits for greedy
#: search; for sampling, until those checked hold this much of the probability, or this many
#: (the others are left out).
CLOSING_MASS = 0.95
CLOSING_CANDIDATES = 32
#: Away from that moment, the way out is traced again every this many tokens.
CLOSING_EVERY = 4
_CLOSERS = frozenset(b'"}]')
_SEPARATORS = frozenset(b',:')
#: id(tokenizer) -> (the tokenizer, its ranks); holding it keeps its id from naming another one
_rank_cache: dict[int, tuple[object, np.ndarray]] = {}
_BARRED = np.iinfo(np.int32).max


def closing_ranks(tokenizer) -> np.ndarray:
    """(vocab,) int32 preference of each token when closing a reply: end ids first; then tokens
    made of closing quotes and brackets, those opening with a quote first (inside a string a
    bracket is text); then tokens of those and separators (a number ends at a comma); then
    tokens holding a closer; then the rest. Longer first within each (a key spelled in fewer
    tokens)."""
    key = id(tokenizer)
    if key not in _rank_cache or _rank_cache[key][0] is not tokenizer:
        ranks = np.empty(tokenizer.vocab_size, np.int32)
        for token in range(tokenizer.vocab_size):
            text = tokenizer.decode_bytes([token])
            if text and all(b in _CLOSERS for b in text):
                group = 1 if text[:1] == b'"' else 2
            elif text and all(b in _CLOSERS or b in _SEPARATORS for b in text):
                group = 3
            else:
                group = 4 if any(b in _CLOSERS for b in text) else 5
            ranks[token] = group * 1000 + 999 - min(len(text), 999)
        ranks[list(tokenizer.eos_tokens)] = 0
        _rank_cache[key] = (tokenizer, ranks)
    return _rank_cache[key][1]


class GrammarConstraint(LogitsProcessor):
    """Scores of tokens the grammar does not allow next are -inf, row by row.

    Args:
        grammar: an llguidance grammar (``constraints.grammar_of`` makes one from a
            ``response_format``).
        tokenizer: the model's ``TextTokenizer`` (context).
        eos_ids: the ids that end a row (context): allowed once the grammar is complete.
        vocab_size: columns of the scores (context).
        num_beams: beam search reorders rows, which a matcher cannot follow: refused.
        max_new_tokens: the budget each reply must close within (context; 0: unbounded).
        do_sample: whether tokens are sampled (context; greedy search needs one way out only).
    """

    def __init__(self, grammar: str, tokenizer=None, eos_ids: list[int] | None = None,
                 vocab_size: int = 0, num_beams: int = 1, max_new_tokens: int = 0,
                 do_sample: bool = False) -> None:
        if tokenizer is None:
            raise InputError("Structured output needs the model's tokenizer (tokenizer.json) to "
                             "know what each token spells; this model has none.")
        if not eos_ids:
            raise InputError("Structured output needs an end id to end a complete reply; this call "
                             "has none (eos_id).")
        if num_beams > 1:
            raise InputError(f"Structured output decodes by greedy search or sampling; beam search "
                             f"(num_beams={num_beams}) reorders rows, which a grammar's state cannot "
                             "follow. Set num_beams=1.")
        self.tokenizer = guidance_tokenizer(tokenizer, eos_ids, vocab_size)
        self.grammar, self.vocab_size, self.budget = grammar, vocab_size, max_new_tokens
        self.sampled = do_sample
        self.ranks = closing_ranks(self.tokenizer)
        self.order = np.argsort(self.ranks, kind="stable").astype(np.int64)
        self.matchers: list = []
        self.seen = 0  # new tokens read so far

    def _start(self, rows: int) -> None:
        from llguidance import LLMatcher
        from llguidance.numpy import allocate_token_bitmask

        self.matchers = [LLMatcher(self.tokenizer, self.grammar, log_level=0) for _ in range(rows)]
        failed = next((m.get_error() for m in self.matchers if m.is_error()), None)
        if failed:
            raise InputError(f"The grammar cannot be used: {failed.splitlines()[0]}")
        self.bitmask = allocate_token_bitmask(rows, self.vocab_size)
        self._trial_mask = allocate_token_bitmask(1, self.vocab_size)
        self.way_out: list[tuple[int, int | None]] = [(0, None)] * rows  # (length, when traced)

    def __call__(self, scores: np.ndarray, state: DecodingState) -> np.ndarray:
        from llguidance.numpy import fill_next_token_bitmask

        rows = len(scores)
        if not self.matchers:
            self._start(rows)
        if state.new_tokens > self.seen:  # the tokens chosen since the last call (one a step)
            for matcher, token in zip(self.matchers, state.ids[:, -1].tolist(), strict=True):
                if not matcher.is_stopped() and not matcher.is_error():
                    matcher.consume_token(token)  # False: in error, which allows only the end ids
            self.seen = state.new_tokens
        for row, matcher in enumerate(self.matchers):
            fill_next_token_bitmask(matcher, self.bitmask, row)
        allowed = np.unpackbits(self.bitmask.view(np.uint8), axis=1, count=scores.shape[1],
                                bitorder="little")
        np.copyto(scores, np.float32(NEVER), where=allowed == 0)
        left = self.budget - state.new_tokens  # tokens still to choose, this one included
        if self.budget:
            for row, matcher in enumerate(self.matchers):
                if (not matcher.is_stopped() and not matcher.is_error()
                        and self._due(row, left, state.new_tokens)):
                    self._keep_in_budget(scores[row], matcher, self.bitmask[row], left, row,
                                         state.new_tokens)
        return scores

    def _due(self, row: int, left: int, step: int) -> bool:
        """Whether ``row``'s way out is traced again now: first at its first token, then every
        :data:`CLOSING_EVERY` tokens near the end, and far from it after a quarter of the
        tokens to spare."""
        length, when = self.way_out[row]
        if when is None:
            return True
        spare = left - length - CLOSING_SLACK - CLOSING_EVERY
        return spare <= 0 or step - when >= max(CLOSING_EVERY, spare // 4)

    def _keep_in_budget(self, scores: np.ndarray, matcher, words: np.ndarray, left: int,
                        row: int, step: int) -> None:
        """Leave only tokens after which the reply can still close within ``left`` tokens:
        the way out when it needs them all, else (near the end) the model's best tokens that
        keep a way out. scores (vocab,) of one row, changed in place."""
        path = self._closing_path(matcher, words, left)
        self.way_out[row] = (len(path), step)
        complete = self._complete(path)
        if len(path) >= left or (not complete and left <= CLOSING_WINDOW):
            keep = [path[0]] if path else []  # no token to spare: take the way out
        elif not complete:
            return
        elif len(path) + CLOSING_SLACK >= left:
            keep = self._fitting(scores, matcher, left - 1) or [path[0]]
        else:
            return
        kept = scores[keep]
        scores[:] = NEVER
        scores[keep] = np.where(np.isfinite(kept), kept, 0.0)

    def _fitting(self, scores: np.ndarray, matcher, most: int) -> list[int]:
        """The model's best tokens after which the reply closes within ``most`` tokens."""
        finite = np.flatnonzero(np.isfinite(scores))
        if len(finite) > CLOSING_CANDIDATES:  # the best few without sorting them all
            finite_best = np.argpartition(-scores[finite], CLOSING_CANDIDATES - 1)[:CLOSING_CANDIDATES]
        else:
            finite_best = np.arange(len(finite))
        best = finite[finite_best]
        order = best[np.argsort(-scores[best], kind="stable")]
        probabilities = np.exp(scores[order] - scores[order[0]])
        probabilities /= np.exp(scores[finite] - scores[order[0]]).sum()
        keep, mass = [], 0.0
        for token, probability in zip(order.tolist(), probabilities.tolist(), strict=True):
            if self._fits(matcher, token, most):
                keep.append(token)
                if not self.sampled:
                    break
            mass += probability
            if keep and mass >= CLOSING_MASS:
                break
        return keep

    def _complete(self, path: list[int]) -> bool:
        return bool(path) and path[-1] in self.tokenizer.eos_tokens

    def _fits(self, matcher, token: int, most: int) -> bool:
        """Whether the reply can close within ``most`` tokens after ``token``."""
        if token in self.tokenizer.eos_tokens:
            return matcher.is_accepting()
        trial = matcher.deep_copy()
        if not trial.consume_token(token):
            return False
        path = self._closing_path(trial, self._mask(trial), most)
        return (not path and trial.is_stopped()) or (len(path) <= most and self._complete(path))

    def _mask(self, matcher) -> np.ndarray:
        """``matcher``'s allowed tokens now, as bitmask words (words,) int32."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(matcher, self._trial_mask, 0)
        return self._trial_mask[0]

    def _preferred(self, words: np.ndarray, barred: int | None) -> int | None:
        """The allowed token (bitmask ``words``) ranked first by :func:`closing_ranks`, other
        than ``barred``: among the few best ranked first (a look at 64 bits), else all."""
        head = self.order[:64]
        hits = head[((words[head >> 5] >> (head & 31)) & 1).astype(bool)]
        hits = hits[hits != barred]
        if len(hits):
            return int(hits[0])
        allowed = np.unpackbits(words.view(np.uint8), count=len(self.ranks), bitorder="little")
        ranked = np.where(allowed.astype(bool), self.ranks, _BARRED)
        if barred is not None:
            ranked[barred] = _BARRED
        token = int(np.argmin(ranked))
        return None if ranked[token] == _BARRED else token

    def _closing_path(self, matcher, words: np.ndarray, most: int) -> list[int]:
        """The tokens (at most ``most``) of the shortest way from ``matcher``'s state to an end
        id, by preference (see :func:`closing_ranks`); ``words``: its bitmask now."""
        trial, path = matcher.deep_copy(), []
        eos = set(self.tokenizer.eos_tokens)
        while len(path) < most:
            # a token that keeps coming back is text (a bracket in a string), not a way out
            token = self._preferred(words, path[-1] if len(path) >= 2 and path[-1] == path[-2]
                                    else None)
            if token is None:
                break
            path.append(token)
            if token in eos or not trial.consume_token(token):
                break
            words = self._mask(trial)
        return path
