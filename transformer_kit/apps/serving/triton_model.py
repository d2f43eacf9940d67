"""Triton Python-backend model, decoupled: generation streamed one response per token, the
requests of all clients decoded together by transformer-kit's continuous-batching
:class:`~transformer_kit.apps.serving.engine.Engine` (as ``transformer-kit serve`` does).
``transformer-kit triton`` copies this file into a repository as ``{name}_generate/1/model.py``;
Triton imports it there (the module ``triton_python_backend_utils`` exists only inside Triton's
Python backend).

Inputs, one of the first three:

- ``input_ids`` (length,) int64: token ids in, ``token_ids`` (1,) int64 out per response;
- ``text_input`` (1,) bytes, a UTF-8 prompt (exports with a tokenizer): ``text_output`` (1,)
  bytes out per response, the text's next piece;
- ``messages`` (1,) bytes, a JSON list of OpenAI-style chat messages (exports with a chat
  template): the assistant's reply as ``text_output`` pieces;

and, optional, ``max_new_tokens``, ``temperature`` (0 or absent: greedy), ``top_p``, ``seed``.
``execute`` only submits: each request's tokens are sent from a thread of its own as the engine
chooses them (the decoupled mode's way), so requests arriving while others decode join the
running batch. A bad request gets one response with an error; the model keeps serving.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

#: The prompt inputs, one per request.
PROMPTS = ("input_ids", "text_input", "messages")
#: The generation options (name -> the Python type to read them as).
OPTIONS = {"max_new_tokens": int, "temperature": float, "top_p": float, "seed": int}


def _numbers(tensor: Any) -> np.ndarray:
    """A numeric input tensor's values, read through DLPack rather than ``as_numpy``: the stubs
    of Triton releases before 24.11 read numpy arrays at numpy 1's struct layout, so under numpy
    2 ``as_numpy`` gave [1, 1, 1, 1] for the ids [1, 2, 3, 4], silently; DLPack carries the
    buffer without numpy's struct, right under either numpy."""
    return np.from_dlpack(tensor).reshape(-1)


def _parameter(config: dict, key: str, default: str) -> str:
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


class TritonPythonModel:
    """Triton's entry points: ``initialize`` loads the export and starts its engine, ``execute``
    submits each request, ``finalize`` closes the engine."""

    def initialize(self, args: dict) -> None:
        from transformer_kit.apps.serving.engine import Engine
        from transformer_kit.export import OnnxModel

        config = json.loads(args["model_config"])
        path = Path(args["model_repository"]) / args["model_version"] / _parameter(config, "export_folder",
                                                                                  "export")
        self.model = OnnxModel(path, providers="auto")
        self.engine = Engine(self.model, max_batch=int(_parameter(config, "max_batch", "16")),
                             max_queue=int(_parameter(config, "max_queue", "64")))
        if int(np.__version__.split(".")[0]) >= 2:
            pb_utils.Logger.log_warn(
                f"numpy {np.__version__} in this model's Python environment: the stubs of Triton "
                "releases before 24.11 read numpy 2 arrays at numpy 1's layout, so with such a "
                "release every response fails ('output tensor shape does not match size of "
                "output') and a text input stops the stub. Name an environment with numpy<2 "
                "(transformer-kit triton --env PATH), or run Triton 24.11 or later.")

    def _options(self, request: Any) -> dict:
        options = {}
        for name, kind in OPTIONS.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                options[name] = kind(_numbers(tensor)[0])
        if options.get("temperature", 0) > 0:
            options["do_sample"] = True
        else:
            options.pop("temperature", None)
            options.pop("top_p", None)
        return options

    def _prompt(self, request: Any) -> tuple[np.ndarray, dict, bool]:
        """(prompt ids (length,), generation options, whether the answer is text)."""
        given = {name: tensor for name in PROMPTS
                 if (tensor := pb_utils.get_input_tensor_by_name(request, name)) is not None}
        if len(given) != 1:
            raise ValueError(f"Give exactly one of {', '.join(PROMPTS)}; got "
                             f"{', '.join(given) or 'none'}.")
        (name, tensor), = given.items()
        options = self._options(request)
        if name == "input_ids":
            return _numbers(tensor).astype(np.int64), options, False
        from transformer_kit.decoding import text

        tokenizer = text.require(self.model.tokenizer, str(self.model.path))
        value = tensor.as_numpy().reshape(-1)[0]
        prompt = value.decode() if isinstance(value, bytes) else str(value)
        if name == "text_input":
            return tokenizer.encode([prompt])[0][0], options, True
        from transformer_kit.chat.conversation import Turn

        try:
            messages = json.loads(prompt)
        except json.JSONDecodeError as exc:
            raise ValueError(f"messages must be a JSON list of chat messages: {exc}") from None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError(f"messages must be a JSON list of chat messages (objects with role and "
                             f"content); got {type(messages).__name__}.")
        turn = Turn(tokenizer, messages, options=options)
        return tokenizer.encode([turn.prompt], add_special_tokens=False)[0][0], turn.options, True

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                ids, options, as_text = self._prompt(request)
                submitted = self.engine.submit(ids, **options)
            except Exception as exc:  # the error goes to the client, the model keeps serving
                self._fail(sender, str(exc))
                continue
            threading.Thread(target=self._stream, args=(sender, submitted, as_text), daemon=True).start()
        return None

    def _stream(self, sender: Any, request: Any, as_text: bool) -> None:
        """Send ``request``'s tokens (or text pieces) as they come, then the final flag; a
        client that cancels ends the request in the engine."""
        from transformer_kit.decoding.text import TextPieces

        pieces = (TextPieces(self.model.tokenizer, request.options.eos_ids(self.model.manifest.eos_id), [])
                  if as_text else None)
        try:
            for token in request:
                if sender.is_cancelled():
                    request.cancel()
                    continue  # the engine ends it at its next step
                if pieces is None:
                    self._send(sender, pb_utils.Tensor("token_ids", np.array([token], np.int64)))
                elif piece := pieces.add(token):
                    self._send(sender, _text(piece))
            if pieces is not None and not pieces.ended and (rest := pieces.finish()):
                self._send(sender, _text(rest))
            if request.finish_reason == "error":
                self._fail(sender, request.error or "generation failed")
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # a response that cannot be sent: end the request
            request.cancel()
            pb_utils.Logger.log_error(f"streaming a response failed: {exc}")

    @staticmethod
    def _send(sender: Any, tensor: Any) -> None:
        sender.send(pb_utils.InferenceResponse(output_tensors=[tensor]))

    @staticmethod
    def _fail(sender: Any, message: str) -> None:
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        self.engine.close()


def _text(piece: str) -> Any:
    """A text piece as ``text_output``: its UTF-8 bytes as a (1,) bytes tensor."""
    return pb_utils.Tensor("text_output", np.array([piece.encode()], dtype=np.object_))
