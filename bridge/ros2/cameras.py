"""Camera topics as encoded tensors: a driver's CompressedImage forwarded untouched, a raw Image encoded here.

A topic map entry declares the decoded shape (the policy's resolution): a `CompressedImage` carries none, and
a raw `Image` is resized to it (`encode.resize`). The gateway decodes the bytes once, into the policy's uint8
batch (bridge.gateway.session.images); the log keeps them compressed.

    >>> from protos.codec import decode
    >>> camera = Camera.parse({"format": "jpeg", "quality": 90, "resize": [2, 3]}, shape=(2, 3, 3), key="cam")
    >>> frame = messages.image(np.zeros((4, 6, 3), np.uint8))           # rgb8 (bgr8, mono8 too)
    >>> t = camera.tensor(Spec("cam", np.uint8, (2, 3, 3), encoding=camera.encoding), frame)
    >>> t.name, list(t.shape), decode(t).shape
    ('cam', [2, 3, 3], (2, 3, 3))
    >>> jpeg = messages.compressed_image(t.data, format="rgb8; jpeg compressed bgr8")
    >>> forwarded = Camera("jpeg").tensor(Spec("cam", np.uint8, (2, 3, 3), encoding=JPEG), jpeg)
    >>> forwarded.data == t.data                                          # the driver's bytes, untouched
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from bridge.ros2 import messages
from protos.codec import IMAGE_FORMATS, JPEG, Spec, TensorError, encode_image
from protos.tether.v1 import tensor_pb2

__all__ = ["JPEG", "Camera", "CameraConfigError"]


class CameraConfigError(ValueError):
    """A camera tensor's `format` or `encode` settings that do not validate (the topic map adds the key)."""


@dataclass(frozen=True)
class Camera:
    """How one camera tensor travels: `format` "jpeg" or "png"; for a raw Image, the JPEG `quality` and an
    optional `resize` to (H, W) before encoding."""

    format: str
    quality: int = 90
    resize: tuple[int, int] | None = None

    @property
    def encoding(self) -> int:
        """The tether.v1 Encoding (JPEG, PNG)."""
        return IMAGE_FORMATS[self.format]

    @classmethod
    def parse(cls, value: object, *, shape: tuple[int, ...], key: str) -> Camera:
        """`{format, quality, resize}` of a raw Image's `encode:` (`shape`: the tensor's declared one)."""
        if not isinstance(value, Mapping):
            raise CameraConfigError(f"{key}: expected a mapping {{format, quality, resize}}, got {value!r}")
        unknown = set(value) - {"format", "quality", "resize"}
        if unknown:
            raise CameraConfigError(f"{key}.{sorted(unknown)[0]}: unknown key; allowed: format, quality, resize")
        fmt = value.get("format", "jpeg")
        if fmt not in IMAGE_FORMATS:
            raise CameraConfigError(f"{key}.format: {fmt!r} is not one of {sorted(IMAGE_FORMATS)}")
        quality = value.get("quality", 90)
        if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
            raise CameraConfigError(f"{key}.quality: expected an integer 1..100, got {quality!r}")
        resize = value.get("resize")
        if resize is not None:
            if not (isinstance(resize, list) and len(resize) == 2
                    and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in resize)):
                raise CameraConfigError(f"{key}.resize: expected [height, width], got {resize!r}")
            if tuple(resize) != tuple(shape[:2]):
                raise CameraConfigError(f"{key}.resize: {resize} disagrees with the tensor's shape {list(shape)} "
                                        "(the policy's resolution: [height, width, channels])")
            resize = (resize[0], resize[1])
        return cls(fmt, quality, resize)

    def tensor(self, spec: Spec, msg: object) -> tensor_pb2.Tensor:
        """This step's tensor from the latest message: a CompressedImage's bytes as they came (its format must
        be this camera's), or a raw Image resized and encoded. MessageError names what does not fit."""
        if msg.__msgtype__ == messages.COMPRESSED_IMAGE:
            got = messages.compressed_format(msg)
            if got != self.format:
                raise messages.MessageError(f"CompressedImage holds {got} ({msg.format!r}), the topic map says "
                                            f"{self.format}")
            return tensor_pb2.Tensor(name=spec.name, dtype=tensor_pb2.UINT8, shape=spec.shape,
                                     data=np.asarray(msg.data, np.uint8).tobytes(), encoding=self.encoding)
        image = messages.image_array(msg)
        if image.shape[2] != spec.shape[2]:
            raise messages.MessageError(f"Image.encoding {msg.encoding!r} has {image.shape[2]} channel(s), tensor "
                                        f"{spec.name!r} takes {spec.shape[2]}")
        if self.resize is not None and image.shape[:2] != self.resize:
            image = _resized(image, self.resize)
        if image.shape != spec.shape:
            raise messages.MessageError(f"Image is {list(image.shape)}, tensor {spec.name!r} takes "
                                        f"{list(spec.shape)} (set encode.resize to scale it)")
        try:
            return encode_image(spec.name, image, quality=self.quality, format=self.format)
        except TensorError as exc:
            raise messages.MessageError(str(exc)) from None


def _resized(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """`image` scaled to (H, W) (Pillow's antialiased bilinear filter)."""
    from PIL import Image  # not at the top: only edges with raw cameras to resize need it

    mono = image.shape[2] == 1
    scaled = Image.fromarray(np.ascontiguousarray(image[:, :, 0] if mono else image)).resize(
        (size[1], size[0]), Image.Resampling.BILINEAR)
    out = np.asarray(scaled)
    return out[:, :, None] if mono else out
