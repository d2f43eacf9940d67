"""Triton Python-backend model, decoupled: generated token ids streamed one response per step
from transformer-kit's ``OnnxModel``. ``transformer-kit triton`` copies this file into a
repository as ``{name}_generate/1/model.py``; Triton imports it there (the module
``triton_python_backend_utils`` exists only inside Triton's Python backend).

Inputs: ``input_ids`` (length,) int64 and, optional, ``max_new_tokens``, ``temperature`` (0 or
absent: greedy), ``top_p``, ``seed``. Output: ``token_ids`` (1,) int64 per response.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from transformer_kit.export import OnnxModel

        config = json.loads(args["model_config"])
        folder = config["parameters"]["export_folder"]["string_value"]
        path = Path(args["model_repository"]) / args["model_version"] / folder
        self.model = OnnxModel(path, providers="auto")

    def _options(self, request) -> dict:
        options = {}
        for name in ("max_new_tokens", "temperature", "top_p", "seed"):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                options[name] = tensor.as_numpy().reshape(-1)[0].item()
        if options.get("temperature", 0) > 0:
            options["do_sample"] = True
        else:
            options.pop("temperature", None)
            options.pop("top_p", None)
        return options

    def execute(self, requests: list) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().reshape(1, -1)
                for step in self.model.stream(ids.astype(np.int64), **self._options(request)):
                    tokens = pb_utils.Tensor("token_ids", np.asarray(step, np.int64).reshape(-1))
                    sender.send(pb_utils.InferenceResponse(output_tensors=[tokens]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as exc:  # the error goes to the client, the model keeps serving
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
