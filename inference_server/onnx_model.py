"""The Triton python-backend model that serves one imported ONNX policy version with onnxruntime.

The bundled Triton (nvidia-pytriton) has only the python backend, so an ONNX file runs here:
onnxruntime on the CPU, one thread, in its own stub process per version.
`ModelRepository.write_artifact` copies this file as `<model>/<version>/model.py` beside
`policy.onnx`. Like triton_model.py, every `execute` concatenates the requests dynamic batching
handed it into one batch (or runs row by row when the graph's batch dimension is fixed at 1) and
splits the outputs back. `triton_python_backend_utils` and onnxruntime are imported lazily, so
this module stays importable outside Triton. Like triton_model.py, loading (the import, the
session, the warm-up) runs in a thread `TETHER_LOAD_NICE` (default 19) niceness steps below the stub's.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

LOAD_NICE_ENV = "TETHER_LOAD_NICE"


def at_low_priority(load: Callable[[], Any], *, nice: int) -> Any:
    """triton_model.at_low_priority, the same text (this file is copied alone into a version folder)."""
    def run() -> Any:
        me = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + nice))
        return load()

    with ThreadPoolExecutor(1, thread_name_prefix="tether-load") as pool:
        return pool.submit(run).result()  # its error raised here, in the caller's thread


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        nice = os.environ.get(LOAD_NICE_ENV, "19")
        if not nice.isdigit() or int(nice) > 19:
            raise ValueError(f"{LOAD_NICE_ENV} must be a niceness increment from 0 to 19, got {nice!r}")
        at_low_priority(lambda: self._load(args), nice=int(nice))

    def _load(self, args: dict) -> None:
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
        pb_utils.Logger.log_info(f"tether: {args['model_name']} version {args['model_version']} loaded at niceness "
                                 f"{os.getpriority(os.PRIO_PROCESS, threading.get_native_id())}")

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
