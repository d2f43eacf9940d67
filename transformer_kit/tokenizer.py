"""A checkpoint's tokenizer: the ``tokenizers`` library over its ``tokenizer.json``, the files
travelling with the model (save, export) byte for byte, prompts encoded in a batch, outputs
decoded without special tokens, and the chat templates rendered as transformers renders them.

The core reaches a tokenizer only through :class:`transformer_kit.core.decoding.text.Tokenizer`;
this class is what the checkpoint readers (Hugging Face, GGUF) and ``OnnxModel`` give it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from transformer_kit.chat import reasoning
from transformer_kit.chat import templates as chat_templates
from transformer_kit.chat.conversation import ChatTurn
from transformer_kit.core.errors import CheckpointError, InputError

#: The files a tokenizer is made of (tokenizer.json is required, the others travel along; so do
#: chat_template.jinja and additional_chat_templates/*.jinja, the chat templates).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   chat_templates.TEMPLATE_FILE)


class TextTokenizer:
    """A Hugging Face ``tokenizer.json`` (and its config files), kept byte for byte.

    Args:
        files: file name (a path relative to the folder) -> contents, ``tokenizer.json`` among
            them; the chat templates among them are :attr:`chat_templates`.
    """

    def __init__(self, files: dict[str, bytes]) -> None:
        from tokenizers import Tokenizer

        self.files = dict(files)
        try:
            self.backend = Tokenizer.from_str(self.files["tokenizer.json"].decode("utf-8"))
        except Exception as exc:  # tokenizers raises its own exception type
            raise CheckpointError(f"tokenizer.json cannot be read by the tokenizers library: {exc}. "
                                  "Copy the checkpoint's tokenizer.json again.") from None
        try:
            #: The checkpoint's chat templates, name -> Jinja text ("default": the unnamed one).
            self.chat_templates = chat_templates.read_templates(self.files)
        except UnicodeDecodeError:
            raise CheckpointError("A chat template file is not UTF-8 text; copy the checkpoint's "
                                  "chat_template.jinja again.") from None
        #: The named special tokens (bos_token, eos_token, ...) -> their text.
        self.special_tokens = chat_templates.read_special_tokens(self.files)
        default = self.chat_templates.get("default", "")
        kept = reasoning.HARMONY_MARKUP if reasoning.reasoning_format(default) == "harmony" else ()
        #: The special ids decoding skips when some are kept (a harmony model's channel markup,
        #: which its replies are read by), else None (all special tokens skipped).
        self.skipped = {i for i, token in self.backend.get_added_tokens_decoder().items()
                        if token.special and token.content not in kept} if kept else None

    @classmethod
    def from_folder(cls, folder: str | Path) -> TextTokenizer | None:
        """The tokenizer files in ``folder``, or None when it has no ``tokenizer.json``."""
        folder = Path(folder)
        if not (folder / "tokenizer.json").is_file():
            return None
        names = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
        extra = folder / chat_templates.TEMPLATE_FOLDER
        if extra.is_dir():
            names += [f"{extra.name}/{p.name}" for p in sorted(extra.glob("*.jinja")) if p.is_file()]
        return cls({name: (folder / name).read_bytes() for name in names})

    def save(self, folder: str | Path) -> list[str]:
        """Write the files into ``folder``; returns their names (relative paths)."""
        for name, data in self.files.items():
            path = Path(folder) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return sorted(self.files)

    def token_id(self, token: str | None) -> int | None:
        """The id of the token written ``token`` (a special token's text), or None."""
        return None if token is None else self.backend.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        """The id of tokenizer_config.json's ``eos_token``, or None."""
        return self.token_id(self.special_tokens.get("eos_token"))

    def chat_template(self, name: str | None = None, tools: list | None = None) -> str:
        """The template text a conversation is rendered with: ``name`` (a template's name or
        text), else ``tool_use`` when tools are given and there is one, else the default."""
        return chat_templates.choose(self.chat_templates, name, tools)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True,
                            tools: list[dict] | None = None, documents: list[dict] | None = None,
                            continue_final_message: bool | str = False,
                            chat_template: str | None = None, **kwargs: Any) -> str:
        """The prompt text of a conversation, as transformers' ``apply_chat_template(...,
        tokenize=False)`` renders it with this checkpoint's template (sandboxed).

        Args:
            messages: ``[{"role": "system" | "user" | "assistant" | "tool", "content": ...}, ...]``
                (assistant messages may carry ``tool_calls``, tool messages ``tool_call_id``).
            add_generation_prompt: end with the header of a new assistant message (on by default:
                the prompt is for generating the reply; transformers' default is off).
            tools: JSON schemas of the functions the model may call, rendered by the template.
            documents: ``[{"title", "text"}]`` for templates that render retrieved documents.
            continue_final_message: leave the last message open, for the model to continue it.
            chat_template: a template's name (``"tool_use"``) or text, instead of the default.
            kwargs: further variables for the template (e.g. ``enable_thinking=False``).

        Encode the result with ``encode(..., add_special_tokens=False)``: the template writes the
        special tokens itself (no doubled BOS).
        """
        if continue_final_message:
            add_generation_prompt = False
        template = self.chat_template(chat_template, tools)
        return chat_templates.render_conversation(
            template, messages, special_tokens=self.special_tokens, tools=tools, documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, **kwargs)

    def chat_turn(self, messages: list[dict], *, tools: list[dict] | None = None,
                  tool_choice: Any = None, chat_template: str | None = None,
                  template_kwargs: dict | None = None, options: dict[str, Any]) -> ChatTurn:
        """One assistant turn of ``messages`` prepared with this tokenizer's templates: the
        prompt, the generation options (a forced tool call's grammar among them) and the reading
        of the reply (see :class:`~transformer_kit.chat.conversation.ChatTurn`)."""
        return ChatTurn(self, messages, tools=tools, tool_choice=tool_choice,
                        chat_template=chat_template, template_kwargs=template_kwargs, options=options)

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Prompts -> ids (batch, longest) int64, right-padded with 0, and real (batch, longest)
        bool, True for real tokens (special tokens added as the tokenizer's post-processor says,
        unless ``add_special_tokens`` is False: a rendered chat holds its own)."""
        encodings = [e.ids for e in self.backend.encode_batch(list(texts),
                                                              add_special_tokens=add_special_tokens)]
        empty = [i for i, ids in enumerate(encodings) if not ids]
        if empty:
            raise InputError(f"Prompts {empty} encode to no token; give some text.")
        width = max(len(ids) for ids in encodings)
        ids = np.zeros((len(encodings), width), np.int64)
        real = np.zeros((len(encodings), width), bool)
        for row, tokens in enumerate(encodings):
            ids[row, :len(tokens)], real[row, :len(tokens)] = tokens, True
        return ids, real

    def decode(self, tokens: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``tokens`` with special tokens skipped (but for a harmony model's channel
        markup, :data:`~transformer_kit.chat.reasoning.HARMONY_MARKUP`); ``skip_special_tokens``
        False: every special token written out."""
        if not skip_special_tokens:
            return self.backend.decode([int(t) for t in tokens], skip_special_tokens=False)
        if self.skipped is None:
            return self.backend.decode([int(t) for t in tokens], skip_special_tokens=True)
        return self.backend.decode([int(t) for t in tokens if int(t) not in self.skipped],
                                   skip_special_tokens=False)

    def token_bytes(self, ids: Iterable[int]) -> list[bytes]:
        """Each id's bytes as the token writes them (a byte-level piece of a character is its
        own bytes; a special token its text), as OpenAI's logprobs report a token's ``bytes``:
        llguidance's reading of the vocabulary where it can read it, else the UTF-8 of the
        id's text."""
        from transformer_kit.core.decoding.response_format import guidance_tokenizer

        size = self.backend.get_vocab_size(with_added_tokens=True)
        ids = [int(i) for i in ids]
        try:
            vocabulary = guidance_tokenizer(self, [], size)
        except InputError:  # a tokenizer llguidance cannot read: each id's text
            vocabulary = None
        return [vocabulary.decode_bytes([i]) if vocabulary is not None and i < size
                else self.backend.decode([i], skip_special_tokens=False).encode() for i in ids]

    def stop_matcher(self, stops: list[str], skip_special_tokens: bool = True
                     ) -> Callable[[np.ndarray], np.ndarray]:
        """new tokens (rows, n) -> (rows,) True where the last token completed a stop string in
        the text of the last few tokens (special tokens skipped unless ``skip_special_tokens`` is
        False, as the reply's text is read). Completed by the last token: a stop string already
        there is one ``min_new_tokens`` held open, which does not end the row later."""
        window = 4 * max(len(s) for s in stops) + 4  # a character takes at most 4 byte tokens

        def completed(text: str, before: str) -> bool:
            # the characters the last token left alone: the common start of the two texts
            common = next((i for i, (a, b) in enumerate(zip(text, before, strict=False)) if a != b),
                          min(len(text), len(before)))
            return any((i := text.rfind(s)) >= 0 and i + len(s) > common for s in stops)

        def matched(new: np.ndarray) -> np.ndarray:
            rows = [row[-window:].tolist() for row in new]
            texts = self.backend.decode_batch(rows, skip_special_tokens=skip_special_tokens)
            hits = np.array([any(s in text for s in stops) for text in texts], dtype=bool)
            for i in np.flatnonzero(hits):  # rare (a row's end): the text before its last token
                before = self.backend.decode(rows[i][:-1], skip_special_tokens=skip_special_tokens)
                hits[i] = completed(texts[i], before)
            return hits

        return matched
