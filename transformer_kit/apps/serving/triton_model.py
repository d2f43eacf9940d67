"""Triton Python-backend model, decoupled: generation streamed one response per step from
transformer-kit's ``OnnxModel``. ``transformer-kit triton`` copies this file into a repository
as ``{name}_generate/1/model.py``; Triton imports it there (the module
``triton_python_backend_utils`` exists only inside Triton's Python backend).

Inputs, one of the first three:

- ``input_ids`` (length,) int64: token ids in, ``token_ids`` (1,) int64 out per response;
- ``text_input`` (1,) bytes, a UTF-8 prompt (exports with a tokenizer): ``text_output`` (1,)
  bytes out per response, the text's next piece;
- ``messages`` (1,) bytes, a JSON list of OpenAI-style chat messages (exports with a chat
  template): the assistant's reply as ``text_output`` pieces;

and, optional, ``max_new_tokens``, ``temperature`` (0 or absent: greedy), ``top_p``, ``seed``.
A bad request gets one response with an error; the model keeps serving the others.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

#: The prompt inputs, one per request.
PROMPTS = ("input_ids", "text_input", "messages")
#: The generation options (name -> the numpy type to read them as).
OPTIONS = {"max_new_tokens": int, "temperature": float, "top_p": float, "seed": int}


def _numbers(tensor: Any) -> np.ndarray:
    """A numeric input tensor's values, read through DLPack rather than ``as_numpy``: the stubs
    of Triton releases before 24.11 read numpy arrays at numpy 1's struct layout, so under numpy
    2 ``as_numpy`` gave [1, 1, 1, 1] for the ids [1, 2, 3, 4], silently; DLPack carries the
    buffer without numpy's struct, right under either numpy."""
    return np.from_dlpack(tensor).reshape(-1)


def _ids_tensor(step: Any) -> Any:
    """A step's token ids as ``token_ids``."""
    return pb_utils.Tensor("token_ids", np.ascontiguousarray(step, np.int64).reshape(-1))


def _text_tensor(piece: str) -> Any:
    """A text piece as ``text_output``: its UTF-8 bytes as a (1,) bytes tensor."""
    return pb_utils.Tensor("text_output", np.array([piece.encode()], dtype=np.object_))


class TritonPythonModel:
    """Triton's entry points: ``initialize`` loads the export, ``execute`` streams each request."""

    def initialize(self, args: dict) -> None:
        from transformer_kit.export import OnnxModel

        config = json.loads(args["model_config"])
        folder = config["parameters"]["export_folder"]["string_value"]
        path = Path(args["model_repository"]) / args["model_version"] / folder
        self.model = OnnxModel(path, providers="auto")
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

    def _responses(self, request: Any) -> Iterator[Any]:
        """The request's responses, one per generated step (its tensors), in order."""
        given = {name: tensor for name in PROMPTS
                 if (tensor := pb_utils.get_input_tensor_by_name(request, name)) is not None}
        if len(given) != 1:
            raise ValueError(f"Give exactly one of {', '.join(PROMPTS)}; got "
                             f"{', '.join(given) or 'none'}.")
        (name, tensor), = given.items()
        options = self._options(request)
        if name == "input_ids":
            ids = _numbers(tensor).astype(np.int64).reshape(1, -1)
            return (_ids_tensor(step) for step in self.model.stream(ids, **options))
        value = tensor.as_numpy().reshape(-1)[0]
        text = value.decode() if isinstance(value, bytes) else str(value)
        if name == "text_input":
            return (_text_tensor(piece) for piece in self.model.stream(text, **options))
        try:
            messages = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"messages must be a JSON list of chat messages: {exc}") from None
        return (_text_tensor(piece) for piece in self.model.stream_chat(messages, **options))

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                for output in self._responses(request):
                    sender.send(pb_utils.InferenceResponse(output_tensors=[output]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as exc:  # the error goes to the client, the model keeps serving
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
