"""The Triton python-backend model that serves one imported ONNX policy version with onnxruntime.

The bundled Triton (nvidia-pytriton) has only the python backend, so an ONNX file runs here:
onnxruntime on the CPU, one thread, in its own stub process per version.
`ModelRepository.write_artifact` copies this file as `<model>/<version>/model.py` beside
`policy.onnx`. Like triton_model.py, every `execute` concatenates the requests dynamic batching
handed it into one batch (or runs row by row when the graph's batch dimension is fixed at 1) and
splits the outputs back. `triton_python_backend_utils` and onnxruntime are imported lazily, so
this module stays importable outside Triton.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        import onnxruntime as ort
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        config = json.loads(args["model_config"])
        self._inputs = [(spec["name"], pb_utils.triton_string_to_numpy(spec["data_type"])) for spec in config["input"]]
        self._outputs = [(spec["name"], pb_utils.triton_string_to_numpy(spec["data_type"]))
                         for spec in config["output"]]
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        folder = Path(args["model_repository"]) / args["model_version"]
        self._session = ort.InferenceSession(str(folder / "policy.onnx"), sess_options=options,
                                             providers=["CPUExecutionProvider"])
        self._row_by_row = any(i.shape[:1] == [1] for i in self._session.get_inputs())
        for batch in (1, 1, max(1, int(config.get("max_batch_size", 1)))):  # warm up while loading
            self._run({name: np.zeros((batch, *(max(1, int(d)) for d in spec["dims"])), dtype)
                       for (name, dtype), spec in zip(self._inputs, config["input"], strict=True)})

    def _run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        names = [name for name, _ in self._outputs]
        if not self._row_by_row:
            result = self._session.run(names, feed)
        else:
            rows = len(next(iter(feed.values())))
            per_row = [self._session.run(names, {k: v[i:i + 1] for k, v in feed.items()}) for i in range(rows)]
            result = [np.concatenate([r[j] for r in per_row]) for j in range(len(names))]
        return [np.asarray(array, dtype=dtype) for array, (_, dtype) in zip(result, self._outputs, strict=True)]

    def execute(self, requests: list) -> list:
        pb = self._pb
        try:
            columns = {name: [pb.get_input_tensor_by_name(r, name).as_numpy() for r in requests]
                       for name, _ in self._inputs}
            sizes = [len(array) for array in next(iter(columns.values()))]
            outputs = self._run({name: np.ascontiguousarray(np.concatenate(arrays), dtype=dtype)
                                 for (name, dtype), arrays in zip(self._inputs, columns.values(), strict=True)})
        except Exception as exc:  # every request of the batch gets the error, the model keeps serving
            error = pb.TritonError(f"{type(exc).__name__}: {exc}")
            return [pb.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        responses, start = [], 0
        for size in sizes:
            tensors = [pb.Tensor(name, np.ascontiguousarray(array[start:start + size]))
                       for (name, _), array in zip(self._outputs, outputs, strict=True)]
            responses.append(pb.InferenceResponse(output_tensors=tensors))
            start += size
        return responses

    def finalize(self) -> None:
        self._session = None
