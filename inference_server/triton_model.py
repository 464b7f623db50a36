"""The Triton python-backend model that serves one TorchScript policy version.

`ModelRepository.write_version` copies this file as `<model>/<version>/model.py` beside
`policy.pt`. Triton runs it inside its python backend stub (one process per version), so it
imports `triton_python_backend_utils` lazily: this module stays importable (and doctest-
collectable) outside Triton. Every `execute` call concatenates the requests that dynamic
batching handed it into one batch, runs the policy once and splits the outputs back.

Loading (importing torch, reading the version, the warm-up: seconds of CPU for a large
version) runs in a thread `TETHER_LOAD_NICE` (default 19) niceness steps below the stub's own
priority (Linux nices threads, not processes), so the stubs already serving other sessions keep
the CPU; `execute` runs on the stub's own thread at its priority:

    >>> at_low_priority(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), nice=19)
    19
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
torch: Any = None  # imported by the loading thread (initialize)


def at_low_priority(load: Callable[[], Any], *, nice: int) -> Any:
    """`load()` run in a thread of its own, `nice` steps below the caller's priority (os.nice's increment,
    niceness at most 19); its result or error."""
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
        global torch
        import torch
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        torch.set_num_threads(1)
        config = json.loads(args["model_config"])
        self._inputs = [spec["name"] for spec in config["input"]]
        self._outputs = [(spec["name"], pb_utils.triton_string_to_numpy(spec["data_type"]))
                         for spec in config["output"]]
        folder = Path(args["model_repository"]) / args["model_version"]
        self._policy = torch.jit.load(str(folder / "policy.pt"), map_location="cpu")
        self._policy.eval()
        for name, tensor in self._policy.state_dict().items():  # an imported file is not checked before
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"weight {name!r} has non-finite values: version {args['model_version']} "
                                 "is not served")
        self._warm_up(config, pb_utils)
        pb_utils.Logger.log_info(f"tether: {args['model_name']} version {args['model_version']} loaded at niceness "
                                 f"{os.getpriority(os.PRIO_PROCESS, threading.get_native_id())}")

    def _warm_up(self, config: dict, pb_utils) -> None:
        """TorchScript optimises a module during its first calls (tens of ms each): pay for that
        while loading, not on a robot's first control step."""
        for batch in (1, 1, 1, max(1, int(config.get("max_batch_size", 1)))):
            zeros = [torch.from_numpy(np.zeros((batch, *(max(1, int(d)) for d in spec["dims"])),
                                               pb_utils.triton_string_to_numpy(spec["data_type"])))
                     for spec in config["input"]]
            with torch.inference_mode():
                self._policy(*zeros)

    def execute(self, requests: list) -> list:
        pb = self._pb
        try:
            columns = [[pb.get_input_tensor_by_name(r, name).as_numpy() for r in requests]
                       for name in self._inputs]
            sizes = [len(array) for array in columns[0]]
            batch = [torch.from_numpy(np.concatenate(arrays)) for arrays in columns]
            with torch.inference_mode():
                result = self._policy(*batch)
            if isinstance(result, torch.Tensor):
                result = (result,)
            if len(result) != len(self._outputs):
                raise ValueError(f"policy returned {len(result)} outputs, config declares "
                                 f"{[name for name, _ in self._outputs]}")
            outputs = [np.asarray(t.numpy(), dtype=dtype)
                       for t, (_, dtype) in zip(result, self._outputs, strict=True)]
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
        self._policy = None
