"""The Triton python-backend model that serves every ONNX version of one policy from one persistent process
(`tether gateway --persistent-versions`): no new stub per version.

`ModelRepository.write_versions_model("pendulum")` installs it as `root/pendulum.versions/1/model.py`, beside a
copy of onnx_model.py (whose batching it reuses); the policy's versions stay where they are,
`root/pendulum/<N>/policy.onnx`, and are never loaded by Triton as versions of their own. Each request names its
version in the request parameter `tether_version` (inference_server.persistent does it); the first request naming
a version opens that version's policy.onnx in an onnxruntime session of this process (a few ms), later ones reuse
it. The files on disk are the truth: a version whose file is absent (never installed, or retired) is an error
naming it, a session whose file went away is dropped when the next version is opened, and at most `max_sessions`
(config parameter, default 8) sessions stay open, the least recently used closed first. After Triton restarts
nothing but the files is needed.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

PARAMETER = "tether_version"


def _onnx_model():
    """onnx_model.py, copied beside this file (imported by path: this folder is not a package)."""
    spec = importlib.util.spec_from_file_location("tether_onnx_model", Path(__file__).with_name("onnx_model.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class VersionMissing(LookupError):
    pass


class TritonPythonModel(_onnx_model().TritonPythonModel):
    def initialize(self, args: dict) -> None:
        import onnxruntime as ort
        import triton_python_backend_utils as pb_utils

        self._pb, self._ort = pb_utils, ort
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self._policy = parameters["policy"]
        self._max_sessions = int(parameters.get("max_sessions", "8"))
        self._folder = Path(args["model_repository"]).parent / self._policy
        self._inputs = [(spec["name"], pb_utils.triton_string_to_numpy(spec["data_type"])) for spec in config["input"]]
        self._outputs = [(spec["name"], pb_utils.triton_string_to_numpy(spec["data_type"]))
                         for spec in config["output"]]
        self._dims = [[max(1, int(d)) for d in spec["dims"]] for spec in config["input"]]
        self._options = ort.SessionOptions()
        self._options.intra_op_num_threads = self._options.inter_op_num_threads = 1
        self._options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self._sessions: OrderedDict[int, tuple[tuple, object, bool]] = OrderedDict()  # version -> (file id, ...)

    def _open(self, version: int) -> tuple[object, bool]:
        """(session, row by row) of `version`, opened at its first request; VersionMissing if its file is absent."""
        path = self._folder / str(version) / "policy.onnx"
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            self._sessions.pop(version, None)
            raise VersionMissing(f"policy {self._policy!r} version {version} has no file {path} (never installed, "
                                 "or retired)") from None
        key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        cached = self._sessions.get(version)
        if cached is not None and cached[0] == key:
            self._sessions.move_to_end(version)
            return cached[1], cached[2]
        for old in [v for v in self._sessions if not (self._folder / str(v) / "policy.onnx").exists()]:
            del self._sessions[old]  # retired versions: their sessions go
        session = self._ort.InferenceSession(str(path), sess_options=self._options, providers=["CPUExecutionProvider"])
        row_by_row = any(i.shape[:1] == [1] for i in session.get_inputs())
        self._session, self._row_by_row = session, row_by_row
        self._run({name: np.zeros((1, *dims), dtype) for (name, dtype), dims in zip(self._inputs, self._dims,
                                                                                     strict=True)})  # warm up
        self._sessions[version] = (key, session, row_by_row)
        while len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)
        return session, row_by_row

    def execute(self, requests: list) -> list:
        pb = self._pb
        groups: dict[int | None, list[int]] = {}
        for i, request in enumerate(requests):
            version = json.loads(request.parameters() or "{}").get(PARAMETER)
            groups.setdefault(version if isinstance(version, int) else None, []).append(i)
        responses: list = [None] * len(requests)
        for version, indices in groups.items():
            try:
                if version is None:
                    raise ValueError(f"the request names no version of policy {self._policy!r} (the integer request "
                                     f"parameter {PARAMETER!r})")
                self._session, self._row_by_row = self._open(version)
            except Exception as exc:
                error = pb.TritonError(f"{type(exc).__name__}: {exc}")
                for i in indices:
                    responses[i] = pb.InferenceResponse(output_tensors=[], error=error)
                continue
            for i, response in zip(indices, super().execute([requests[i] for i in indices]), strict=True):
                responses[i] = response
        return responses

    def finalize(self) -> None:
        self._sessions.clear()
        self._session = None
