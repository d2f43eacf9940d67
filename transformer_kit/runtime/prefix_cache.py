"""Prefix caching for the engine: the key/value cache of prompts already prefilled, kept
so that a later prompt starting with the same tokens (a system prompt, few-shot examples, a chat's
history) prefills only the tokens after them.

After its prefill, each prompt's cache is kept as one entry: its token ids and its cache as
the batch's layout keeps an entry (``CacheLayout.prefix_entry``: its real columns). A new
prompt reuses the longest run of leading tokens it shares with an entry (exact token ids,
compared in full), except its last token: that one is always computed, for its logits.
Lookup goes through hashes of block-aligned prefixes (one per
:data:`BLOCK` tokens, each chained on the one before) to the entries that share the most whole
blocks, then compares tokens; a match shorter than one block is not used. Entries are bounded by
bytes (their values' sizes); past the bound the least recently used go first. An entry whose
tokens all begin a newer prompt (the previous turn of a chat) is replaced by that prompt's.

Values passed as the past of a run are not modified by it, so one entry serves many requests at
once, and the engine's batch may hold the very values an entry holds.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from transformer_kit.core.errors import InputError

if TYPE_CHECKING:
    from transformer_kit.runtime.cache_layout import CacheLayout
    from transformer_kit.runtime.requests import Row

#: Tokens per hashed block: the shortest prefix reused, and the step of the lookup's hashes.
BLOCK = 16


def block_keys(prompt: np.ndarray) -> list[int]:
    """The chained hashes of a prompt's (length,) whole blocks: key ``j`` stands for its first
    ``(j + 1) * BLOCK`` tokens."""
    keys, key = [], 0
    for start in range(0, len(prompt) - BLOCK + 1, BLOCK):
        key = hash((key, prompt[start:start + BLOCK].tobytes()))
        keys.append(key)
    return keys


@dataclass(eq=False)
class Entry:
    """One cached prompt: ``tokens`` (length,) int64 and ``values``, its cache as the layout
    keeps it; ``nbytes``: the values' size; ``keys``: its block hashes."""

    tokens: np.ndarray
    values: Any
    nbytes: int
    keys: list[int]


@dataclass(frozen=True)
class Hit:
    """A prompt's cached prefix: the first ``tokens`` columns of ``entry``'s values."""

    entry: Entry
    tokens: int


def common_length(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading token ids of ``a`` and ``b`` (each (length,)) are equal."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


class PrefixCache:
    """Prompts' caches kept for reuse, at most ``max_bytes`` of them (least recently used out
    first), entries as ``layout`` (the batch's :class:`CacheLayout`) makes and reads them.

    Counters (for metrics): ``hits``, ``misses`` (requests admitted with and without a cached
    prefix), ``reused_tokens`` (prompt tokens not prefilled again), ``evictions``; ``nbytes``:
    bytes held now.
    """

    def __init__(self, max_bytes: int, layout: CacheLayout) -> None:
        """A hit reuses a multiple of ``layout.prefill_chunk`` tokens (an aligned layout prefills
        in chunks, so that a prompt continuing a cached prefix computes what it computes from
        scratch)."""
        if max_bytes < 1:
            raise InputError(f"A prefix cache needs a bound of at least 1 byte, got {max_bytes}; "
                             "leave it out (0) to cache no prefixes.")
        self.max_bytes, self.layout, self.granule = max_bytes, layout, layout.prefill_chunk
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # id -> entry, least recent first
        self.index: dict[int, dict[int, None]] = {}  # block key -> ids of its entries, in order
        self.nbytes = self.hits = self.misses = self.reused_tokens = self.evictions = 0

    def __len__(self) -> int:
        return len(self.entries)

    def find(self, prompt: np.ndarray, keys: list[int]) -> Hit | None:
        """The longest cached prefix of ``prompt`` (length,), leaving at least the layout's
        ``prefix_room`` tokens to compute (the last one for the logits), of at least one block;
        None without one. ``keys``: ``block_keys(prompt)``. Changes nothing (see :meth:`use`)."""
        best: Hit | None = None
        room = self.layout.prefix_room
        for entry in self._sharing(keys):  # the most recent first: it wins a tie
            common = min(common_length(entry.tokens, prompt), len(prompt) - room)
            common -= common % self.granule
            if common >= max(BLOCK - 1, self.granule) and (best is None or common > best.tokens):
                best = Hit(entry, common)
        return best

    def _sharing(self, keys: list[int]) -> list[Entry]:
        """The entries sharing the most whole blocks with a prompt whose ``block_keys`` are
        ``keys``, the most recent first."""
        ids: dict[int, None] = {}
        for key in keys:
            if key not in self.index:
                break
            ids = self.index[key]
        return [self.entries[ident] for ident in reversed(ids)]

    def use(self, hit: Hit | None) -> int:
        """Count a request admitted with ``hit`` (None: a miss) and mark its entry as the most
        recently used; the tokens it reuses."""
        if hit is None:
            self.misses += 1
            return 0
        self.hits += 1
        self.reused_tokens += hit.tokens
        if self.entries.get(id(hit.entry)) is hit.entry:  # not replaced since (by a group's row)
            self.entries.move_to_end(id(hit.entry))
        return hit.tokens

    def past(self, hit: Hit, rows: int) -> Any:
        """The cached prefix as the past of a prefill of ``rows`` rows (``CacheLayout.prefill``)."""
        return self.layout.prefix_past(hit.entry.values, rows, hit.tokens)

    def store(self, tokens: np.ndarray, block: Any, row: int) -> None:
        """Keep prompt ``tokens`` (length,) whose cache is row ``row`` of prefilled rows
        ``block``, unless a prompt this short cannot be reused, an entry holds the same tokens
        (it becomes the most recent), or it is over the bound."""
        if len(tokens) < BLOCK:
            return
        keys = block_keys(tokens)
        # an entry whose tokens all begin this prompt, whether or not a hit could reuse it (a
        # one-chunk prompt's own entry is not a hit for it: its last token is computed)
        held = next((e for e in self._sharing(keys) if common_length(e.tokens, tokens) == len(e.tokens)),
                    None)
        if held is not None:
            if len(held.tokens) == len(tokens):  # the same prompt: keep the entry it has
                self.entries.move_to_end(id(held))
                return
            self._drop(held)  # a prefix of this prompt: this entry does all it did
        values, nbytes = self.layout.prefix_entry(block, row)
        if nbytes > self.max_bytes:
            return
        while self.nbytes + nbytes > self.max_bytes:
            self._drop(next(iter(self.entries.values())))
            self.evictions += 1
        entry = Entry(np.array(tokens, np.int64), values, nbytes, keys)
        self.entries[id(entry)] = entry
        for key in keys:
            self.index.setdefault(key, {})[id(entry)] = None
        self.nbytes += nbytes

    def _drop(self, entry: Entry) -> None:
        del self.entries[id(entry)]
        for key in entry.keys:
            ids = self.index[key]
            del ids[id(entry)]
            if not ids:
                del self.index[key]
        self.nbytes -= entry.nbytes


def next_group(pending: list[Row], prefill_tokens: int, cache: PrefixCache | None,
               keys: dict[int, list[int]], same_length: bool = False) -> tuple[list[Row], Hit | None]:
    """Take the next group of ``pending`` requests (sorted by prompt length) to prefill in one
    run, with at most ``prefill_tokens`` padded new tokens (a longer prompt runs alone), and the
    cached prefix they continue (None: from scratch).

    With a cache, the requests whose longest cached prefix lies in the same entry go together,
    continuing the prefix they all share; else the shortest prompts, leaving for a later group a
    prompt that starts with the same block (with a granule: the same first chunk) as one taken
    (after this group's prefill it is a hit).
    ``keys``: each request's ``block_keys``, by ``id``. ``same_length``: only prompts of one
    length (after one cached prefix) go together, without padding. The group leaves ``pending``.
    """
    hits = {} if cache is None else {id(r): cache.find(r.prompt, keys[id(r)]) for r in pending}
    first = next((hit for hit in hits.values() if hit is not None), None)
    group: list[Row] = []
    if first is not None:
        shared = first.tokens
        for request in list(pending):
            hit = hits[id(request)]
            if hit is None or hit.entry is not first.entry:
                continue
            tokens = min(shared, hit.tokens)
            if group and same_length and (tokens != shared or len(request.prompt) != len(group[0].prompt)):
                continue
            if group and (len(group) + 1) * (len(request.prompt) - tokens) > prefill_tokens:
                break
            group.append(request)
            shared = tokens
            pending.remove(request)
        return group, Hit(first.entry, shared)
    firsts: set[int] = set()
    # the key of the shortest prefix a hit reuses: a block, or a whole chunk of the cache's granule
    first_key = max(cache.granule // BLOCK, 1) - 1 if cache is not None else 0
    for request in list(pending):
        if group and ((len(group) + 1) * len(request.prompt) > prefill_tokens
                      or (same_length and len(request.prompt) != len(group[0].prompt))):
            break
        reusable = (cache is not None and len(keys[id(request)]) > first_key
                    and len(request.prompt) > cache.granule)
        head = keys[id(request)][first_key] if reusable else None
        if head in firsts:
            continue
        if head is not None:
            firsts.add(head)
        group.append(request)
        pending.remove(request)
    return group, None
