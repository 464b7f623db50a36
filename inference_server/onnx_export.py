"""A module-written version served by onnxruntime instead of torch (opt-in per model: `serve="onnx"`).

Each Triton version is its own stub process; a torch-served one imports torch when it loads
(2-3 CPU-seconds), an onnxruntime-served one ~0.3. For a policy swapped often, serving through
ONNX makes publish -> live that much faster. The TorchScript stays in the version folder
(`policy.pt`: the architecture new weights are loaded into, the weights Fetch returns); the
version serves `policy.onnx`, exported from it and checked against it here:

    data = export(scripted, observation_spec, action_spec)   # ValueError if the export differs

Only outputs that are deterministic (equal on two TorchScript runs) are compared; a stochastic
policy's sampled outputs are checked for shape and dtype.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence

import numpy as np
import torch

from protos.codec import Spec

_CHECK_BATCH = 3


def export(scripted: torch.jit.ScriptModule, observation_spec: Sequence[Spec], action_spec: Sequence[Spec]) -> bytes:
    """The ONNX file of `scripted` (a copy is exported; the module is left as it is), batch dynamic."""
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    inputs = [s.name for s in observation_spec]
    outputs = [s.name for s in action_spec]
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript-based exporter is deprecated, and says so
        copy = torch.jit.load(buffer, map_location="cpu").eval()
        zeros = tuple(torch.from_numpy(np.zeros((1, *s.shape), s.dtype)) for s in observation_spec)
        try:
            torch.onnx.export(copy, zeros, out, input_names=inputs, output_names=outputs, dynamo=False,
                              dynamic_axes={name: {0: "batch"} for name in inputs + outputs})
        except Exception as exc:
            raise ValueError(f"the policy does not export to ONNX: {type(exc).__name__}: {exc}") from exc
        data = out.getvalue()
        _check_same(copy, data, tuple(observation_spec), tuple(action_spec))
    return data


def _check_same(module: torch.jit.ScriptModule, data: bytes, observation_spec: tuple[Spec, ...],
                action_spec: tuple[Spec, ...]) -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    feed = {s.name: (rng.standard_normal((_CHECK_BATCH, *s.shape)) if s.dtype.kind == "f"
                     else np.zeros((_CHECK_BATCH, *s.shape))).astype(s.dtype) for s in observation_spec}

    def torch_run() -> list[np.ndarray]:
        with torch.no_grad():  # not inference_mode: after an export the module would trip over it
            result = module(*(torch.from_numpy(feed[s.name]) for s in observation_spec))
        return [t.detach().numpy() for t in ((result,) if isinstance(result, torch.Tensor) else result)]

    first, second = torch_run(), torch_run()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])
    served = session.run([s.name for s in action_spec], feed)
    for spec, a, b, got in zip(action_spec, first, second, served, strict=True):
        if got.shape != a.shape or got.dtype != a.dtype:
            raise ValueError(f"the ONNX export gives {spec.name!r} as {got.dtype.name}{list(got.shape)}, TorchScript "
                             f"as {a.dtype.name}{list(a.shape)}")
        if np.array_equal(a, b) and not np.allclose(got, a, rtol=1e-4, atol=1e-5):
            error = float(np.max(np.abs(got.astype(np.float64) - a)))
            raise ValueError(f"the ONNX export differs from the TorchScript on {spec.name!r}: "
                             f"max abs error {error:.3g}")
