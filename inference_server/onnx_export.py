"""A module-written version served by onnxruntime instead of torch (opt-in per model: `serve="onnx"`).

Each Triton version is its own stub process; a torch-served one imports torch when it loads
(2-3 CPU-seconds), an onnxruntime-served one ~0.3. For a policy swapped often, serving through
ONNX makes publish -> live that much faster. The TorchScript stays in the version folder
(`policy.pt`: the architecture new weights are loaded into, the weights Fetch returns); the
version serves `policy.onnx`, exported from it and checked against it here:

    data = export(scripted, observation_spec, action_spec)   # ValueError if the export differs
    data = reweight(data, scripted_v2, observation_spec, action_spec)   # v2's weights in v1's graph

`export` writes every tensor of the state dict the graph reads as an initializer named after its key
(exported with distinct stand-in values and no constant folding, so the exporter neither merges equal
tensors nor folds one into a derived constant; the real values are put in afterwards) and marks the
file so. `reweight` then makes a later version's file without exporting again (~100 CPU-ms saved per
version): the initializers replaced by name. A file without the mark, or whose initializers do not
fit the weights, is exported again. Either way the result is checked against the TorchScript.

Only outputs that are deterministic (equal on two TorchScript runs) are compared; a stochastic
policy's sampled outputs are checked for shape and dtype.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

from protos.codec import Spec

_CHECK_BATCH = 3
_MARK = "tether.initializers"  # metadata key: "state_dict" when every initializer is a state-dict tensor by name


def export(scripted: torch.jit.ScriptModule, observation_spec: Sequence[Spec], action_spec: Sequence[Spec]) -> bytes:
    """The ONNX file of `scripted` (a copy is exported; the module is left as it is), batch dynamic."""
    import torch
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript-based exporter is deprecated, and says so
        buffer.seek(0)
        copy = torch.jit.load(buffer, map_location="cpu").eval()
        real = {k: v.clone() for k, v in copy.state_dict().items()}
        data = None
        if _distinct_after_stand_ins(real):
            _stand_ins(copy)
            data = _with_weights(_export(copy, observation_spec, action_spec, fold=False), real, mark=True)
            copy.load_state_dict(real, strict=True)
        if data is None:  # an initializer the exporter named or derived itself: a plain export, not marked
            data = _export(copy, observation_spec, action_spec, fold=True)
        _check_same(copy, data, tuple(observation_spec), tuple(action_spec))
    return data


def _export(module: torch.jit.ScriptModule, observation_spec: Sequence[Spec], action_spec: Sequence[Spec], *,
            fold: bool) -> bytes:
    import torch
    inputs = [s.name for s in observation_spec]
    outputs = [s.name for s in action_spec]
    zeros = tuple(torch.from_numpy(np.zeros((1, *s.shape), s.dtype)) for s in observation_spec)
    out = io.BytesIO()
    try:
        torch.onnx.export(module, zeros, out, input_names=inputs, output_names=outputs, dynamo=False,
                          do_constant_folding=fold, dynamic_axes={name: {0: "batch"} for name in inputs + outputs})
    except Exception as exc:
        raise ValueError(f"the policy does not export to ONNX: {type(exc).__name__}: {exc}") from exc
    return out.getvalue()


def reweight(base: bytes, scripted: torch.jit.ScriptModule, observation_spec: Sequence[Spec],
             action_spec: Sequence[Spec]) -> bytes:
    """The ONNX file of `scripted` made from `base` (the file of a version with the same architecture, written
    by `export`) by replacing its initializers with `scripted`'s tensors of the same names, checked against
    `scripted`; exported again (`export`) when `base` is not marked as named by state dict or does not fit."""
    weights = {k: v.detach() for k, v in scripted.state_dict().items()}
    data = _with_weights(base, weights, mark=False)
    if data is None:
        return export(scripted, observation_spec, action_spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _check_same(scripted, data, tuple(observation_spec), tuple(action_spec))
    return data


def _stand_ins(module: torch.jit.ScriptModule) -> None:
    """Distinct values in every floating-point tensor of `module`'s state dict (in place): no two are equal, so
    the exporter keeps each as its own initializer. Positive, near 1: divisions and logs stay finite."""
    import torch
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for tensor in module.state_dict().values():
            if tensor.is_floating_point():
                tensor.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, tuple(tensor.shape))).to(tensor.dtype))


def _distinct_after_stand_ins(state: dict[str, torch.Tensor]) -> bool:
    """No two tensors the exporter could merge once the floating-point ones have stand-ins: the others (masks,
    counters) pairwise different in dtype, shape or value."""
    seen = set()
    for tensor in state.values():
        if not tensor.is_floating_point():
            key = (str(tensor.dtype), tuple(tensor.shape), tensor.contiguous().numpy().tobytes())
            if key in seen:
                return False
            seen.add(key)
    return bool(state)


def _with_weights(data: bytes, weights: dict[str, torch.Tensor], *, mark: bool) -> bytes | None:
    """`data` with each initializer replaced by the tensor of `weights` of its name (same shape and dtype), and
    marked when `mark`; None when an initializer has no such tensor, or (not `mark`) `data` is not marked."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load_model_from_string(data)
    marked = any(p.key == _MARK and p.value == "state_dict" for p in model.metadata_props)
    if not mark and not marked:
        return None
    for init in model.graph.initializer:
        tensor = weights.get(init.name)
        try:  # a dtype numpy has no type for (bfloat16): no by-name file
            array = None if tensor is None else tensor.detach().contiguous().numpy()
            expected = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        except (TypeError, KeyError):
            return None
        if array is None or tuple(init.dims) != array.shape or expected != array.dtype:
            return None
        init.CopyFrom(numpy_helper.from_array(array, init.name))
    if mark:
        model.metadata_props.add(key=_MARK, value="state_dict")
    return model.SerializeToString()


def _check_same(module: torch.jit.ScriptModule, data: bytes, observation_spec: tuple[Spec, ...],
                action_spec: tuple[Spec, ...]) -> None:
    import onnxruntime as ort
    import torch

    rng = np.random.default_rng(0)
    feed = {s.name: (rng.standard_normal((_CHECK_BATCH, *s.shape)) if s.dtype.kind == "f"
                     else np.zeros((_CHECK_BATCH, *s.shape))).astype(s.dtype) for s in observation_spec}

    def torch_run() -> list[np.ndarray]:
        # not inference_mode: after an export the module would trip over it (nor optimized_execution(False): a
        # later inference_mode run of the same class then fails)
        with torch.no_grad():
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
