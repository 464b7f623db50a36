"""What every policy file is described by: its specs, and the error that names what does not fit.
The formats themselves (TorchScript, ONNX: detect, check, serve, export) are in inference_server.formats.

Specs on a command line are NAME:DTYPE:SHAPE[:LOW:HIGH], shape and bounds comma-separated:

    >>> s = parse_spec("action:float32:2:-1:1")
    >>> s.name, s.dtype.name, s.shape, s.low, s.high
    ('action', 'float32', (2,), (-1.0,), (1.0,))
    >>> parse_spec("obs:float32:3,0")
    Traceback (most recent call last):
    ...
    inference_server.artifact.ArtifactError: spec 'obs:float32:3,0': shape dimensions must be >= 1, got [3, 0]

A TorchScript file carries its specs in a `tether.json` extra file (`torch.jit.save(module, path,
_extra_files={"tether.json": specs_to_json(inputs, outputs)})`):

    >>> text = specs_to_json([parse_spec("obs:float32:3")], [parse_spec("action:float32:2:-1:1")])
    >>> [s.name for s in specs_from_json(text)[1]]
    ['action']
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from protos.codec import Spec, TensorError

SPEC_FILE = "tether.json"


class ArtifactError(ValueError):
    """An imported file or spec that cannot be served; the message names the bad value."""


def parse_spec(text: str) -> Spec:
    """NAME:DTYPE:SHAPE[:LOW:HIGH] -> Spec (bounds: one value for all elements, or one per element)."""
    parts = text.split(":")
    if len(parts) not in (3, 5):
        raise ArtifactError(f"spec {text!r} must be NAME:DTYPE:SHAPE or NAME:DTYPE:SHAPE:LOW:HIGH")
    name, dtype, shape = parts[:3]
    try:
        dims = [int(d) for d in shape.split(",")]
        low, high = ((tuple(float(v) for v in parts[i].split(",")) for i in (3, 4)) if len(parts) == 5
                     else ((), ()))
    except ValueError:
        raise ArtifactError(f"spec {text!r}: shape and bounds must be comma-separated numbers") from None
    if any(d < 1 for d in dims):
        raise ArtifactError(f"spec {text!r}: shape dimensions must be >= 1, got {dims}")
    try:
        spec = Spec(name, np.dtype(dtype), tuple(dims), low, high)
    except (TypeError, TensorError) as exc:
        raise ArtifactError(f"spec {text!r}: {exc}") from None
    check_bounds(spec)
    return spec


def check_bounds(spec: Spec) -> None:
    """ArtifactError unless `spec` has no bounds, one for all elements or one per element, low <= high."""
    size = int(np.prod(spec.shape))
    for what, values in (("low", spec.low), ("high", spec.high)):
        if len(values) not in (0, 1, size):
            raise ArtifactError(f"tensor {spec.name!r}: {len(values)} {what} bounds for {size} elements")
    if spec.low and spec.high and not np.all(np.asarray(spec.low) <= np.asarray(spec.high)):
        raise ArtifactError(f"tensor {spec.name!r}: low {list(spec.low)} above high {list(spec.high)}")


def specs_to_json(inputs: Sequence[Spec], outputs: Sequence[Spec]) -> str:
    def entry(s: Spec) -> dict:
        return {"name": s.name, "dtype": s.dtype.name, "shape": list(s.shape), "low": list(s.low),
                "high": list(s.high)}

    return json.dumps({"inputs": [entry(s) for s in inputs], "outputs": [entry(s) for s in outputs]}, indent=1)


def specs_from_json(text: str | bytes) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    try:
        doc = json.loads(text)
        return tuple(tuple(Spec(e["name"], np.dtype(e["dtype"]), tuple(e["shape"]), tuple(e.get("low", ())),
                                tuple(e.get("high", ()))) for e in doc[key]) for key in ("inputs", "outputs"))
    except (ValueError, TypeError, KeyError) as exc:
        raise ArtifactError(f"{SPEC_FILE} is not a spec file ({{'inputs': [...], 'outputs': [...]}}): "
                            f"{type(exc).__name__}: {exc}") from None
