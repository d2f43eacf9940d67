"""A segment's text tokens grouped into timed words, as openai-whisper and transformers group
them: split where a token decodes to whole characters (every such piece a word in languages
written without spaces), else at spaces and punctuation; leading punctuation joined to the word
after it, trailing punctuation to the word before."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Languages written without spaces between words: every whole character is a word.
UNSPACED = {"zh", "ja", "th", "lo", "my", "yue"}
PREPENDED = "\"'“¡¿([{-"
APPENDED = "\"'.。,，!！?？:：”)]}、"
_PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_REPLACEMENT = "\ufffd"


def _pieces(tokenizer: Any, tokens: Sequence[int]) -> list[tuple[str, list[int]]]:
    """(text, token indices) of the shortest runs of tokens that decode to whole characters (a
    character's bytes may span tokens)."""
    full = tokenizer.decode(list(tokens))
    pieces, run, offset = [], [], 0
    for index in range(len(tokens)):
        run.append(index)
        text = tokenizer.decode([tokens[i] for i in run])
        cut = text.find(_REPLACEMENT)
        if cut < 0 or offset + cut >= len(full) or full[offset + cut] == _REPLACEMENT:
            pieces.append((text, run))
            run, offset = [], offset + len(text)
    return pieces


def group_words(tokenizer: Any, tokens: Sequence[int], language: str | None
                ) -> list[tuple[str, list[int]]]:
    """(word, its token indices) for text ``tokens`` (no special or timestamp tokens)."""
    words: list[tuple[str, list[int]]] = []
    for text, indices in _pieces(tokenizer, tokens):
        if (language in UNSPACED or not words or text.startswith(" ")
                or text.strip() in _PUNCTUATION):
            words.append((text, list(indices)))
        else:
            words[-1] = (words[-1][0] + text, words[-1][1] + indices)
    texts, groups = [w for w, _ in words], [i for _, i in words]
    i, j = len(texts) - 2, len(texts) - 1
    while i >= 0:  # an opening mark joins the word after it
        if texts[i].startswith(" ") and texts[i].strip() in PREPENDED:
            texts[j], groups[j] = texts[i] + texts[j], groups[i] + groups[j]
            texts[i], groups[i] = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(texts):  # a closing mark joins the word before it
        if not texts[i].endswith(" ") and texts[j] in APPENDED:
            texts[i], groups[i] = texts[i] + texts[j], groups[i] + groups[j]
            texts[j], groups[j] = "", []
        else:
            i = j
        j += 1
    return [(text, group) for text, group in zip(texts, groups, strict=True) if text]


def timed_words(tokenizer: Any, tokens: Sequence[int], times: Sequence[float], text_below: int,
                language: str | None) -> list[dict]:
    """The words of a segment's ``tokens`` (text and timestamp ids), each ``{word, start, end}``
    in seconds: a word starts at its first token's time and ends at the time of the token
    after its last (transformers' and openai-whisper's word timestamps); ``times`` holds one
    time per token and one more, the token after the segment's. Ids from ``text_below`` up are
    not text."""
    text = [i for i, t in enumerate(tokens) if t < text_below]
    return [{"word": word, "start": round(float(times[text[group[0]]]), 2),
             "end": round(float(times[text[group[-1]] + 1]), 2)}
            for word, group in group_words(tokenizer, [tokens[i] for i in text], language)]
