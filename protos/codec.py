"""Tensor <-> numpy codecs and the frozen `Spec` every package validates against.

    >>> import numpy as np
    >>> t = encode("qpos", np.arange(3, dtype=np.float32))
    >>> t.name, list(t.shape), decode(t).tolist()
    ('qpos', [3], [0.0, 1.0, 2.0])
    >>> spec = Spec("qpos", np.float32, (3,))
    >>> Spec.from_proto(spec.to_proto()) == spec
    True

Camera frames travel encoded (`Tensor.encoding` JPEG or PNG): dtype and shape are the decoded image's,
uint8 (H, W, 3) or (H, W, 1), and `decode` gives exactly that array or raises `TensorError`:

    >>> frame = encode_image("camera", np.full((4, 6, 3), 128, np.uint8), quality=90)
    >>> encoding_name(frame.encoding), list(frame.shape), decode(frame).shape
    ('JPEG', [4, 6, 3], (4, 6, 3))
"""

from __future__ import annotations

import io
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


RAW, JPEG, PNG = tensor_pb2.RAW, tensor_pb2.JPEG, tensor_pb2.PNG
IMAGE_FORMATS = {"jpeg": JPEG, "png": PNG}  # the names the edge's topic map uses
IMAGE_DTYPE = np.dtype("u1")
MAX_ENCODED_OVERHEAD = 1 << 16  # an encoded image may exceed its raw size by this (headers of a tiny frame)


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
    """A read-only numpy view over the message bytes (RAW), or the decoded image (JPEG, PNG); raises
    `TensorError` on a size mismatch, an image that does not decode or decodes to another shape."""
    if tensor.encoding != RAW:
        return decode_image(tensor)
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


def encoding_name(code: int) -> str:
    """'RAW', 'JPEG' or 'PNG' (TensorError for a code this build does not know)."""
    try:
        return tensor_pb2.Encoding.Name(code)
    except ValueError:
        raise TensorError("encoding", f"unknown encoding {code}") from None


def image_shape_problem(dtype: np.dtype, shape: Sequence[int]) -> str | None:
    """Why an encoded image cannot have this decoded dtype and shape (uint8, (H, W, 1 or 3)), or None."""
    if np.dtype(dtype) != IMAGE_DTYPE or len(shape) != 3 or shape[2] not in (1, 3) or min(shape) < 1:
        return (f"an encoded image decodes to uint8 (H, W, 3) or (H, W, 1), not "
                f"{np.dtype(dtype).name}{list(shape)}")
    return None


def encode_image(name: str, array: np.ndarray, *, quality: int = 90, format: str = "jpeg") -> tensor_pb2.Tensor:
    """A uint8 RGB (H, W, 3) or mono (H, W, 1) image as an encoded `Tensor` (`format` "jpeg" or "png";
    `quality` 1-100 for JPEG, 4:2:0 chroma as camera drivers send). A 2-D array is mono (H, W, 1)."""
    array = np.asarray(array)
    if array.ndim == 2:
        array = array[:, :, None]
    if (why := image_shape_problem(array.dtype, array.shape)) is not None:
        raise TensorError(name, why)
    if (code := IMAGE_FORMATS.get(format)) is None:
        raise TensorError(name, f"image format {format!r}: expected one of {sorted(IMAGE_FORMATS)}")
    if not 1 <= quality <= 100:
        raise TensorError(name, f"JPEG quality {quality}: expected 1..100")
    array = np.ascontiguousarray(array)
    if code == JPEG:
        import simplejpeg  # not at the top: the gateway's and the edge's import time (benchmarks/jpeg_codecs.py)

        mono = array.shape[2] == 1
        data = simplejpeg.encode_jpeg(array, quality, colorspace="GRAY" if mono else "RGB",
                                      colorsubsampling="Gray" if mono else "420")
    else:
        from PIL import Image

        out = io.BytesIO()
        Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array).save(out, "PNG", compress_level=1)
        data = out.getvalue()
    return tensor_pb2.Tensor(name=name, dtype=tensor_pb2.UINT8, shape=array.shape, data=data, encoding=code)


def decode_image(tensor: tensor_pb2.Tensor) -> np.ndarray:
    """An encoded `Tensor`'s image: exactly its declared uint8 (H, W, C), else `TensorError` naming it (a header
    declaring other dimensions is refused before its pixels are decompressed)."""
    name, shape = tensor.name, tuple(tensor.shape)
    kind = encoding_name(tensor.encoding)
    if kind == "RAW":
        raise TensorError(name, "not an encoded image")
    if (why := image_shape_problem(dtype_to_numpy(tensor.dtype), shape)) is not None:
        raise TensorError(name, why)
    data = tensor.data
    try:
        got, array = _decode_jpeg(data, shape) if kind == "JPEG" else _decode_png(name, data, shape)
    except TensorError:
        raise
    except Exception as exc:  # the libraries' errors on corrupt or truncated bytes (ValueError, OSError, ...)
        raise TensorError(name, f"corrupt {kind} ({len(data)} bytes): {exc}") from None
    if got != shape:
        raise TensorError(name, f"{kind} image is {list(got)}, declared {list(shape)}")
    return array


def _decode_jpeg(data: bytes, shape: tuple[int, ...]) -> tuple[tuple[int, ...], np.ndarray | None]:
    import simplejpeg

    h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    channels = {"Gray": 1, "CMYK": 4, "YCCK": 4}.get(colorspace, 3)  # YCbCr, RGB: 3
    if (h, w, channels) != shape:
        return (h, w, channels), None
    array = simplejpeg.decode_jpeg(data, colorspace="GRAY" if channels == 1 else "RGB")
    return array.shape if array.ndim == 3 else (*array.shape, 1), array.reshape(shape)


def _decode_png(name: str, data: bytes, shape: tuple[int, ...]) -> tuple[tuple[int, ...], np.ndarray | None]:
    from PIL import Image

    with Image.open(io.BytesIO(data), formats=["PNG"]) as image:
        if image.mode not in ("L", "RGB"):
            raise TensorError(name, f"PNG of mode {image.mode}: expected L (mono) or RGB")
        w, h = image.size
        got = (h, w, 1 if image.mode == "L" else 3)
        if got != shape:
            return got, None
        return got, np.asarray(image).reshape(shape)


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
    encoding: int = RAW  # how the sender encodes it: JPEG, PNG (a camera: uint8 (H, W, 1|3)) or RAW

    def __post_init__(self):
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        if not self.name:
            raise TensorError("name", "a tensor spec needs a name")
        if any(d < 0 for d in self.shape):
            raise TensorError(self.name, f"negative dimension in spec shape {list(self.shape)}")
        dtype_to_proto(self.dtype)
        if self.encoding != RAW:
            encoding_name(self.encoding)
            if (why := image_shape_problem(self.dtype, self.shape)) is not None:
                raise TensorError(self.name, f"{encoding_name(self.encoding)}: {why}")

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
                                     low=self.low, high=self.high, encoding=self.encoding)

    @classmethod
    def from_proto(cls, msg: tensor_pb2.TensorSpec) -> Spec:
        return cls(msg.name, dtype_to_numpy(msg.dtype), tuple(msg.shape), tuple(msg.low), tuple(msg.high),
                   encoding=msg.encoding)

    def check_declared(self, tensor: tensor_pb2.Tensor) -> None:
        """As `check`, on the dtype and shape a message declares, before its bytes are touched: a
        tensor that cannot fit (a 30 MB frame for an 11-float spec) costs no copy. An encoded tensor must come in
        the spec's encoding, within its raw size plus `MAX_ENCODED_OVERHEAD` bytes (its pixels: `decode`)."""
        if tensor.encoding != self.encoding:
            got = tensor_pb2.Encoding.Name(tensor.encoding) if tensor.encoding in tensor_pb2.Encoding.values() \
                else f"{tensor.encoding} (unknown)"
            raise TensorError(self.name, f"encoding {got}, declared {encoding_name(self.encoding)}")
        if self.encoding != RAW and len(tensor.data) > math.prod(self.shape) + MAX_ENCODED_OVERHEAD:
            raise TensorError(self.name, f"{len(tensor.data)} bytes of {encoding_name(self.encoding)} for a "
                                         f"{list(self.shape)} image")
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


def check_all(specs: Sequence[Spec], tensors: Sequence[tensor_pb2.Tensor],
              decoded: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Decode `tensors` and check them against `specs`: same names, dtypes, shapes, all finite.
    Names, dtypes and shapes are checked before any bytes are decoded. `decoded`: images already decoded
    by name (the gateway's pool, bridge.gateway.session.images), used instead of decoding them here."""
    by_name = {s.name: s for s in specs}
    arrays = {}
    for t in tensors:
        if t.name in arrays:
            raise TensorError(t.name, "sent twice")
        if (spec := by_name.get(t.name)) is None:
            raise TensorError(t.name, f"not in the declared spec {sorted(by_name)}")
        spec.check_declared(t)
        arrays[t.name] = decoded[t.name] if decoded and t.name in decoded else decode(t)
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
