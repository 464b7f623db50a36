"""Where a topic map's tensors sit on the wire and in the guard's command vector (`TensorLayout`).

Worked out once per node, so each step fills and checks its messages with it rather than through
the generic codec (less code per step; a paced step runs cold). The node's call loop: observation
arrays go into the outgoing message with `fill`; a reply's action tensors become the guard's
float64 vector with `vector`; what the guard lets through is cut back into tensors with `split`
for the command topics and `encode`d as the next observation's `applied_action`:

    >>> layout = TensorLayout((Spec("arm", np.float32, (4,)), Spec("grip", np.float32, (2,))))
    >>> layout.size
    6
    >>> action = [encode("arm", np.arange(4, dtype=np.float32) / 8), encode("grip", np.ones(2, np.float32))]
    >>> vector = layout.vector(action)           # checked against the specs; float64, spec order
    >>> vector.tolist()
    [0.0, 0.125, 0.25, 0.375, 1.0, 1.0]
    >>> arrays = layout.split(vector)            # e.g. the guard's decision.sent
    >>> arrays["grip"].tolist()
    [1.0, 1.0]
    >>> [(t.name, t.dtype == action[0].dtype) for t in layout.encode(arrays)]  # back in the specs' dtypes
    [('arm', True), ('grip', True)]
    >>> layout.vector(action[:1])
    Traceback (most recent call last):
    ...
    protos.codec.TensorError: grip: missing
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from protos.codec import Spec, check_all, dtype_to_proto, encode
from protos.tether.v1 import tensor_pb2

__all__ = ["TensorLayout"]


@dataclass(frozen=True)
class _Slot:
    """One tensor's wire form and its place in the command vector."""

    name: str
    code: int                      # tether.v1 DType
    shape: list[int]               # a list: compares equal to a repeated proto field
    dtype: np.dtype
    nbytes: int
    part: slice                    # where the tensor sits in the guard's command vector
    encoded: bool = False          # a camera's: its value is an encoded Tensor already (bridge.ros2.cameras)


class TensorLayout:
    """The specs' tensors, concatenated in spec order into one flat vector of `size` values."""

    def __init__(self, specs: Sequence[Spec]):
        self.specs = tuple(specs)
        slots, start = [], 0
        for s in self.specs:
            n = math.prod(s.shape)
            slots.append(_Slot(s.name, dtype_to_proto(s.dtype), list(s.shape), s.dtype, n * s.dtype.itemsize,
                               slice(start, start + n), s.encoding != tensor_pb2.RAW))
            start += n
        self._slots = tuple(slots)
        self.size = start

    def fill(self, tensors, arrays: Mapping[str, np.ndarray]) -> None:
        """Add the arrays to a message's repeated `tensors` field, in place; they already have the
        specs' dtypes and shapes (a camera's value is its encoded Tensor: appended as it is)."""
        add = tensors.add
        for t in self._slots:
            if t.encoded:
                tensors.append(arrays[t.name])
            else:
                add(name=t.name, dtype=t.code, shape=t.shape, data=arrays[t.name].tobytes())

    def vector(self, tensors: Sequence[tensor_pb2.Tensor]) -> np.ndarray:
        """The tensors as the guard's float64 command vector (spec order). The usual case, exactly
        the spec's tensors in its order, is checked field by field; anything else goes through
        `check_all`, which names what is wrong (TensorError) or accepts another order."""
        slots = self._slots
        if len(tensors) == len(slots):
            parts = []
            for t, want in zip(tensors, slots, strict=True):
                if t.name != want.name or t.dtype != want.code or t.shape != want.shape or len(t.data) != want.nbytes:
                    break
                parts.append(np.frombuffer(t.data, want.dtype))
            else:
                vector = (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(np.float64)
                if np.isfinite(vector).all():
                    return vector
        arrays = check_all(self.specs, tensors)
        return np.concatenate([np.asarray(arrays[t.name], np.float64).reshape(-1) for t in slots])

    def split(self, vector: np.ndarray) -> dict[str, np.ndarray]:
        """The vector cut back into the specs' tensors (views, in the vector's dtype)."""
        return {t.name: vector[t.part].reshape(t.shape) for t in self._slots}

    def encode(self, arrays: Mapping[str, np.ndarray]) -> list[tensor_pb2.Tensor]:
        """The arrays as tensors in the specs' order and dtypes."""
        return [encode(t.name, arrays[t.name].astype(t.dtype)) for t in self._slots]
