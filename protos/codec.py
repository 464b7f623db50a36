"""Tensor <-> numpy codecs and the frozen `Spec` every package validates against.

    >>> import numpy as np
    >>> t = encode("qpos", np.arange(3, dtype=np.float32))
    >>> t.name, list(t.shape), decode(t).tolist()
    ('qpos', [3], [0.0, 1.0, 2.0])
    >>> spec = Spec("qpos", np.float32, (3,))
    >>> Spec.from_proto(spec.to_proto()) == spec
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from protos.tether.v1 import tensor_pb2

_TO_NUMPY = {
    tensor_pb2.FLOAT32: np.dtype("<f4"),
    tensor_pb2.FLOAT64: np.dtype("<f8"),
    tensor_pb2.FLOAT16: np.dtype("<f2"),
    tensor_pb2.INT32: np.dtype("<i4"),
    tensor_pb2.INT64: np.dtype("<i8"),
    tensor_pb2.UINT8: np.dtype("u1"),
    tensor_pb2.BOOL: np.dtype("?"),
}
_TO_PROTO = {dt: code for code, dt in _TO_NUMPY.items()}
_TRITON = {tensor_pb2.FLOAT32: "FP32", tensor_pb2.FLOAT64: "FP64", tensor_pb2.FLOAT16: "FP16",
           tensor_pb2.INT32: "INT32", tensor_pb2.INT64: "INT64", tensor_pb2.UINT8: "UINT8",
           tensor_pb2.BOOL: "BOOL"}


class TensorError(ValueError):
    """A tensor that does not decode or does not match its spec; `field` names the tensor."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def dtype_to_proto(dtype: np.dtype | type | str) -> int:
    dt = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)
    try:
        return _TO_PROTO[dt]
    except KeyError:
        raise TensorError("dtype", f"unsupported dtype {np.dtype(dtype)}") from None


def dtype_to_numpy(code: int) -> np.dtype:
    try:
        return _TO_NUMPY[code]
    except KeyError:
        raise TensorError("dtype", f"unsupported dtype code {code}") from None


def triton_dtype(code: int) -> str:
    """The Triton datatype string ("FP32", ...) for a proto dtype code."""
    return _TRITON[code]


def encode(name: str, array: np.ndarray) -> tensor_pb2.Tensor:
    """One numpy array as a typed `Tensor` (copied once into the message bytes)."""
    array = np.asarray(array)
    code = dtype_to_proto(array.dtype)
    data = np.ascontiguousarray(array, dtype=_TO_NUMPY[code]).tobytes()
    return tensor_pb2.Tensor(name=name, dtype=code, shape=array.shape, data=data)


def decode(tensor: tensor_pb2.Tensor) -> np.ndarray:
    """A read-only numpy view over the message bytes; raises `TensorError` on a size mismatch."""
    dtype = dtype_to_numpy(tensor.dtype)
    shape = tuple(tensor.shape)
    if any(d < 0 for d in shape):
        raise TensorError(tensor.name, f"negative dimension in shape {list(shape)}")
    expected = math.prod(shape) * dtype.itemsize
    data = tensor.data  # one copy out of the message (each access makes one)
    if len(data) != expected:
        raise TensorError(tensor.name, f"{len(data)} bytes for shape {list(shape)} of "
                                       f"{dtype.name} (expected {expected})")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def encode_all(arrays: Mapping[str, np.ndarray]) -> list[tensor_pb2.Tensor]:
    return [encode(name, value) for name, value in arrays.items()]


def decode_all(tensors: Iterable[tensor_pb2.Tensor]) -> dict[str, np.ndarray]:
    return {t.name: decode(t) for t in tensors}


@dataclass(frozen=True)
class Spec:
    """Name, dtype and shape (no batch dimension) of one tensor, with optional bounds."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    low: tuple[float, ...] = field(default=(), compare=False)
    high: tuple[float, ...] = field(default=(), compare=False)

    def __post_init__(self):
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if not self.name:
            raise TensorError("name", "a tensor spec needs a name")
        if any(d < 0 for d in self.shape):
            raise TensorError(self.name, f"negative dimension in spec shape {list(self.shape)}")
        dtype_to_proto(self.dtype)

    @property
    def bounded(self) -> bool:
        """Whether the spec declares any bound (an empty side is unbounded)."""
        return bool(self.low or self.high)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) as float64 arrays of the spec's shape: one value for all or one per element (see
        tensor.proto), -inf/+inf on a side it leaves empty. The one reading of low/high (sim, gate, gateway).

        >>> low, high = Spec("a", np.float32, (2, 2), low=(0.0, 1.0, 2.0, 3.0), high=(5.0,)).bounds()
        >>> low.tolist(), high.tolist()
        ([[0.0, 1.0], [2.0, 3.0]], [[5.0, 5.0], [5.0, 5.0]])
        >>> Spec("a", np.float32, (3,), low=(0.0, 1.0)).bounds()
        Traceback (most recent call last):
        ...
        protos.codec.TensorError: a: 2 low bounds for shape [3]
        """
        size = math.prod(self.shape)
        sides = []
        for side, values, fill in (("low", self.low, -np.inf), ("high", self.high, np.inf)):
            if len(values) not in (0, 1, size):
                raise TensorError(self.name, f"{len(values)} {side} bounds for shape {list(self.shape)}")
            sides.append(np.full(self.shape, fill) if not values else np.broadcast_to(
                np.asarray(values, dtype=np.float64).reshape(self.shape if len(values) == size else ()),
                self.shape))
        low, high = sides
        if (low > high).any():
            raise TensorError(self.name, "low bound above high bound")
        return low, high

    def safe_value(self) -> np.ndarray:
        """The action a refused or held env gets for this tensor: zero, clipped into the bounds, in its dtype.

        >>> Spec("a", np.float32, (2,), low=(0.5, -1.0), high=(1.0, 1.0)).safe_value().tolist()
        [0.5, 0.0]
        """
        value = np.zeros(self.shape, self.dtype)
        return np.clip(value, *self.bounds()).astype(self.dtype) if self.bounded else value

    def to_proto(self) -> tensor_pb2.TensorSpec:
        return tensor_pb2.TensorSpec(name=self.name, dtype=dtype_to_proto(self.dtype), shape=self.shape,
                                     low=self.low, high=self.high)

    @classmethod
    def from_proto(cls, msg: tensor_pb2.TensorSpec) -> Spec:
        return cls(msg.name, dtype_to_numpy(msg.dtype), tuple(msg.shape), tuple(msg.low), tuple(msg.high))

    def check_declared(self, tensor: tensor_pb2.Tensor) -> None:
        """As `check`, on the dtype and shape a message declares, before its bytes are touched: a
        tensor that cannot fit (a 30 MB frame for an 11-float spec) costs no copy."""
        dtype = dtype_to_numpy(tensor.dtype)
        if dtype != self.dtype:
            raise TensorError(self.name, f"dtype {dtype.name}, expected {self.dtype.name}")
        if tuple(tensor.shape) != self.shape:
            raise TensorError(self.name, f"shape {list(tensor.shape)}, expected {list(self.shape)}")

    def check(self, array: np.ndarray) -> None:
        """Raise `TensorError` naming this tensor if `array` has another dtype or shape, or NaN/inf."""
        if array.dtype != self.dtype:
            raise TensorError(self.name, f"dtype {array.dtype.name}, expected {self.dtype.name}")
        if array.shape != self.shape:
            raise TensorError(self.name, f"shape {list(array.shape)}, expected {list(self.shape)}")
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise TensorError(self.name, "contains NaN or infinite values")


def specs_from_proto(msgs: Sequence[tensor_pb2.TensorSpec]) -> tuple[Spec, ...]:
    specs = tuple(Spec.from_proto(m) for m in msgs)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise TensorError("spec", f"duplicate tensor names in {names}")
    return specs


def check_all(specs: Sequence[Spec], tensors: Sequence[tensor_pb2.Tensor]) -> dict[str, np.ndarray]:
    """Decode `tensors` and check them against `specs`: same names, dtypes, shapes, all finite.
    Names, dtypes and shapes are checked before any bytes are decoded."""
    by_name = {s.name: s for s in specs}
    arrays = {}
    for t in tensors:
        if t.name in arrays:
            raise TensorError(t.name, "sent twice")
        if (spec := by_name.get(t.name)) is None:
            raise TensorError(t.name, f"not in the declared spec {sorted(by_name)}")
        spec.check_declared(t)
        arrays[t.name] = decode(t)
    for spec in specs:
        if spec.name not in arrays:
            raise TensorError(spec.name, "missing")
        spec.check(arrays[spec.name])
    return arrays


TRANSITION_TENSORS = ("observation", "action", "applied_action", "next_observation")


def transition_problem(t) -> str | None:
    """Why a logged `tether.v1.Transition` cannot be learned from, or None: a tensor that does not decode
    (bytes that do not fit its dtype and shape, an unknown dtype), a name sent twice, a NaN/inf value,
    no observation or no action, a non-finite reward or log-probability. Readers (BC, PPO, `tether log
    export`) skip such a record and count it instead of crashing on it at every resume.

    >>> from protos import experience_pb2
    >>> ok = experience_pb2.Transition(observation=[encode("obs", np.zeros(2, np.float32))],
    ...                                action=[encode("action", np.ones(1, np.float32))], reward=1.0)
    >>> transition_problem(ok) is None
    True
    >>> bad = experience_pb2.Transition(); bad.CopyFrom(ok); bad.action[0].data = np.float32("nan").tobytes()
    >>> transition_problem(bad)
    'action.action: contains NaN or infinite values'
    """
    for group in TRANSITION_TENSORS:
        seen = set()
        for tensor in getattr(t, group):
            if tensor.name in seen:
                return f"{group}.{tensor.name}: sent twice"
            seen.add(tensor.name)
            try:
                array = decode(tensor)
            except (TensorError, ValueError) as exc:
                return f"{group}.{exc}"
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                return f"{group}.{tensor.name}: contains NaN or infinite values"
    if not t.observation or not t.action:
        return "no observation" if not t.observation else "no action"
    if not math.isfinite(t.reward):
        return f"reward: non-finite {t.reward}"
    if t.has_log_prob and not math.isfinite(t.log_prob):
        return f"log_prob: non-finite {t.log_prob}"
    return None
