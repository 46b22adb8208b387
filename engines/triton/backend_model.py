"""Triton python-backend model that runs the ONNX file beside it with ONNX Runtime on the CPU.

Written into each model's version directory as `model.py` by `swapcast triton export --platform python`:
the `tritonserver` in the nvidia-pytriton wheel has only the python backend, so this is how that server
serves the same ONNX files swapcast runs in-process. Triton's dynamic batcher hands `execute` several
requests at once; they run as one batch (stacked on the leading axis) and the outputs are split back.
"""

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.inputs = [tensor["name"] for tensor in config["input"]]
        self.outputs = [tensor["name"] for tensor in config["output"]]
        self.batched = int(config.get("max_batch_size", 0)) > 0
        threads = int(config.get("parameters", {}).get("threads", {}).get("string_value", "1"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def execute(self, requests: list[Any]) -> list[Any]:
        if not self.batched or len(requests) == 1:
            return [self._respond(self._run([request])) for request in requests]
        return self._split(self._run(requests), requests)

    def _feeds(self, requests: list[Any]) -> dict[str, np.ndarray]:
        return {
            name: np.concatenate([pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests])
            for name in self.inputs
        }

    def _run(self, requests: list[Any]) -> list[np.ndarray]:
        results: list[np.ndarray] = self.session.run(self.outputs, self._feeds(requests))
        return results

    def _respond(self, results: list[np.ndarray]) -> Any:
        tensors = [
            pb_utils.Tensor(name, np.ascontiguousarray(value))
            for name, value in zip(self.outputs, results, strict=True)
        ]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _split(self, results: list[np.ndarray], requests: list[Any]) -> list[Any]:
        responses = []
        start = 0
        for request in requests:
            size = pb_utils.get_input_tensor_by_name(request, self.inputs[0]).as_numpy().shape[0]
            responses.append(self._respond([value[start : start + size] for value in results]))
            start += size
        return responses

    def finalize(self) -> None:
        self.session = None
