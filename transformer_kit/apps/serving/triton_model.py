"""Triton Python-backend model, decoupled, over the runtime's
:class:`~transformer_kit.runtime.Service`: the requests of all clients batched by
transformer-kit's engine (as ``transformer-kit serve`` does), within the same limits (prompt
tokens, request time, request size: the config's ``max_prompt_tokens``, ``max_request_seconds``
and ``max_body_bytes``).
``transformer-kit triton`` copies this file into a repository as ``{name}_generate/1/model.py``
(or ``_embed``, ``_rerank``); Triton imports it there (the module ``triton_python_backend_utils``
exists only inside Triton's Python backend).

A decoder's model (``_generate``) takes one of

- ``input_ids`` (length,) int64: token ids in, ``token_ids`` (1,) int64 out per response;
- ``text_input`` (1,) bytes, a UTF-8 prompt (exports with a tokenizer): ``text_output`` (1,)
  bytes out per response, the text's next piece;
- ``messages`` (1,) bytes, a JSON list of OpenAI-style chat messages (exports with a chat
  template): the assistant's reply as ``text_output`` pieces;

and, optional, ``max_new_tokens``, ``temperature`` (0 or absent: greedy), ``top_p``, ``seed``.
An embedding model's (``_embed``) takes ``text_input`` (n,) bytes and, optional,
``dimensions``, and answers once with ``embedding`` (n, dim) float32; a cross-encoder's
(``_rerank``) takes ``query`` (1,) and ``documents`` (n,) bytes and answers once with
``scores`` (n,) float32, in the documents' order. ``execute`` only submits: each request is
answered from a thread of its own as the engine produces it (the decoupled mode's way), so
requests arriving while others run join the running batch. A bad request, or one past the
limits, gets one response with an error; the model keeps serving. A request whose inputs are
larger than ``max_body_bytes`` is refused before its text is read or tokenized (on HTTP and gRPC
alike; Triton has read it by then: its own bound on HTTP is ``--http-max-input-size``, gRPC has
none).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

#: A decoder's prompt inputs, one per request.
PROMPTS = ("input_ids", "text_input", "messages")
#: The generation options (name -> the Python type to read them as).
OPTIONS = {"max_new_tokens": int, "temperature": float, "top_p": float, "seed": int}


def _numbers(tensor: Any) -> np.ndarray:
    """A numeric input tensor's values, read through DLPack rather than ``as_numpy``: the stubs
    of Triton releases before 24.11 read numpy arrays at numpy 1's struct layout, so under numpy
    2 ``as_numpy`` gave [1, 1, 1, 1] for the ids [1, 2, 3, 4], silently; DLPack carries the
    buffer without numpy's struct, right under either numpy."""
    return np.from_dlpack(tensor).reshape(-1)


def _strings(tensor: Any) -> list[str]:
    """A bytes input tensor's values as text."""
    return [v.decode() if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]


def _byte_size(tensor: Any, texts: frozenset[str]) -> int:
    """The bytes an input tensor carries as Triton serializes it: each string's UTF-8 bytes and
    4 for its length (an input named in ``texts``, the config's strings), or the numbers' buffer."""
    if tensor.name() in texts:
        return sum(4 + len(v) for v in tensor.as_numpy().reshape(-1))
    return _numbers(tensor).nbytes


def _check_size(request: Any, max_body_bytes: int | None, texts: frozenset[str]) -> None:
    """Refuse (ValueError) a request whose inputs are larger than ``max_body_bytes`` (None: any
    size), with the sentence of ``transformer-kit serve``'s body bound."""
    if max_body_bytes is None:
        return
    size = sum(_byte_size(tensor, texts) for tensor in request.inputs())
    if size > max_body_bytes:
        raise ValueError(f"The request's inputs are {size:,} bytes; this server takes at most "
                         f"{max_body_bytes:,} bytes (--max-body-mb). Send less per request (several "
                         "requests are batched together), or write the repository again with a "
                         "larger --max-body-mb.")


def _parameter(config: dict, key: str, default: str | None) -> str | None:
    return config.get("parameters", {}).get(key, {}).get("string_value", default)


class TritonPythonModel:
    """Triton's entry points: ``initialize`` loads the export and starts its engine, ``execute``
    submits each request, ``finalize`` closes the engine."""

    def initialize(self, args: dict) -> None:
        from transformer_kit.runtime import Engine, Limits, OnnxModel, Service

        config = json.loads(args["model_config"])
        path = Path(args["model_repository"]) / args["model_version"] / _parameter(config, "export_folder",
                                                                                  "export")
        model = OnnxModel(path, providers="auto")
        engine = Engine(model, max_batch=int(_parameter(config, "max_batch", "16")),
                        max_queue=int(_parameter(config, "max_queue", "64")))
        prompts, seconds = (_parameter(config, key, None) for key in ("max_prompt_tokens",
                                                                      "max_request_seconds"))
        limits = Limits.of(model.context_length, prompts and int(prompts), seconds and float(seconds))
        self.service = Service(engine, limits)
        body = _parameter(config, "max_body_bytes", None)
        self.max_body_bytes: int | None = int(body) if body else None
        # the string inputs (pb_utils' Tensor.triton_dtype() fails in stubs before 24.11)
        self.texts = frozenset(i["name"] for i in config["input"] if i["data_type"] == "TYPE_STRING")
        if int(np.__version__.split(".")[0]) >= 2:
            pb_utils.Logger.log_warn(
                f"numpy {np.__version__} in this model's Python environment: the stubs of Triton "
                "releases before 24.11 read numpy 2 arrays at numpy 1's layout, so with such a "
                "release every response fails ('output tensor shape does not match size of "
                "output') and a text input stops the stub. Name an environment with numpy<2 "
                "(transformer-kit triton --env PATH), or run Triton 24.11 or later.")

    def execute(self, requests: list) -> None:
        answer = self._stream if self.service.kind == "generate" else self._pooled
        for request in requests:
            sender = request.get_response_sender()
            try:
                _check_size(request, self.max_body_bytes, self.texts)
                submitted = self._submit(request)
            except Exception as exc:  # the error goes to the client, the model keeps serving
                self._fail(sender, str(exc))
                continue
            threading.Thread(target=answer, args=(sender, *submitted), daemon=True).start()
        return None

    def _submit(self, request: Any) -> tuple[Any, bool]:
        """The request submitted to the service: (a pooled request, False), or (a text stream,
        whether its answer is text)."""
        tensors = {name: pb_utils.get_input_tensor_by_name(request, name)
                   for name in ("dimensions", "query", "documents", *PROMPTS, *OPTIONS)}
        if self.service.kind == "embeddings":
            dimensions = tensors["dimensions"]
            size = None if dimensions is None else int(_numbers(dimensions)[0])
            return self.service.embed(_strings(tensors["text_input"]), dimensions=size), False
        if self.service.kind == "rerank":
            return self.service.rerank(_strings(tensors["query"])[0], _strings(tensors["documents"])), False
        given = {name: tensors[name] for name in PROMPTS if tensors[name] is not None}
        if len(given) != 1:
            raise ValueError(f"Give exactly one of {', '.join(PROMPTS)}; got "
                             f"{', '.join(given) or 'none'}.")
        (name, tensor), = given.items()
        options = {key: kind(_numbers(tensors[key])[0]) for key, kind in OPTIONS.items()
                   if tensors[key] is not None}
        options["max_tokens"] = options.pop("max_new_tokens", None)
        options.setdefault("temperature", 0.0)  # absent: greedy
        if name == "input_ids":
            return self.service.complete(_numbers(tensor).astype(np.int64).tolist(), **options), False
        prompt = _strings(tensor)[0]
        if name == "text_input":
            return self.service.complete(prompt, **options), True
        try:
            messages = json.loads(prompt)
        except json.JSONDecodeError as exc:
            raise ValueError(f"messages must be a JSON list of chat messages: {exc}") from None
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError(f"messages must be a JSON list of chat messages (objects with role and "
                             f"content); got {type(messages).__name__}.")
        return self.service.chat(messages, **options), True

    def _stream(self, sender: Any, stream: Any, as_text: bool) -> None:
        """Send the stream's tokens (or text pieces, ``as_text``) as they come, then the final
        flag; a client that cancels ends the request in the engine."""
        try:
            for delta in stream:
                if sender.is_cancelled():
                    stream.cancel()
                    continue  # the engine ends it at its next step
                if not as_text:
                    self._send(sender, pb_utils.Tensor("token_ids", np.array([delta.token_id], np.int64)))
                elif delta.text:
                    self._send(sender, _text(delta.text))
            if as_text and (rest := stream.rest()):
                self._send(sender, _text(rest))
            if stream.failure is not None:
                self._fail(sender, stream.failure.message)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # a response that cannot be sent: end the request
            stream.cancel()
            pb_utils.Logger.log_error(f"streaming a response failed: {exc}")

    def _pooled(self, sender: Any, job: Any, _: bool) -> None:
        """Send the request's vectors or scores once it ended (or its failure)."""
        job.request.wait()
        if sender.is_cancelled():
            return
        if job.failure is not None:
            self._fail(sender, job.failure.message)
            return
        if self.service.kind == "embeddings":
            tensor = pb_utils.Tensor("embedding", np.ascontiguousarray(job.vectors(), np.float32))
        else:
            tensor = pb_utils.Tensor("scores", np.ascontiguousarray(job.scores(), np.float32))
        sender.send(pb_utils.InferenceResponse(output_tensors=[tensor]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    @staticmethod
    def _send(sender: Any, tensor: Any) -> None:
        sender.send(pb_utils.InferenceResponse(output_tensors=[tensor]))

    @staticmethod
    def _fail(sender: Any, message: str) -> None:
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        self.service.close()


def _text(piece: str) -> Any:
    """A text piece as ``text_output``: its UTF-8 bytes as a (1,) bytes tensor."""
    return pb_utils.Tensor("text_output", np.array([piece.encode()], dtype=np.object_))
