"""Weights as `tether.v1.Policies` carries them: a safetensors file, cut straight from the tensors' memory.

    parts = safetensors_parts(policy.state_dict())    # the header, then each tensor's memory: nothing joined
    state_dict = from_safetensors(blob)               # WeightsError for a blob that is not safetensors

torch is imported when these are called, not with this module (the edge imports `bridge.client` without it).

    >>> import torch
    >>> from_safetensors(to_safetensors({"w": torch.ones(2)}))["w"].tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["WeightsError", "chunked", "from_safetensors", "safetensors_parts", "to_safetensors"]


class WeightsError(ValueError):
    """Fetched weights that do not match their header (size, sha256) or are not safetensors."""


@cache
def _dtype_names() -> dict:
    import torch

    return {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
            torch.bool: "BOOL"}


def safetensors_parts(state_dict: Mapping[str, torch.Tensor]) -> list[bytes | memoryview]:
    """The safetensors file of `state_dict` as pieces: its header, then each tensor's own memory (CPU tensors are
    not copied). Tensors in the order safetensors writes them (wider dtypes first, then by name).

    >>> import torch
    >>> parts = safetensors_parts({"w": torch.ones(2), "n": torch.zeros(1, dtype=torch.int64)})
    >>> from_safetensors(b"".join(parts))["w"].tolist(), sum(len(p) for p in parts) % 8
    ([1.0, 1.0], 0)
    """
    import torch

    names = _dtype_names()
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    header, offset = {}, 0
    for name in sorted(tensors, key=lambda k: (-tensors[k].element_size(), k)):
        t = tensors[name]
        if t.dtype not in names:
            raise ValueError(f"{name}: dtype {t.dtype} has no safetensors name")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [struct.pack("<Q", len(text)) + text,
            *(memoryview(tensors[name].reshape(-1).view(torch.uint8).numpy()) for name in header)]


def to_safetensors(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    return b"".join(safetensors_parts(state_dict))


def from_safetensors(blob: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        return load(blob)
    except Exception as e:  # safetensors raises its own SafetensorError for malformed headers
        raise WeightsError(f"not a safetensors blob ({len(blob)} bytes): {e}") from e


def chunked(parts: Iterable[bytes | memoryview], size: int) -> Iterator[bytes]:
    """`parts` re-cut into pieces of `size` bytes (the last shorter): one piece in memory at a time.

    >>> list(chunked([b"abc", b"de"], 2))
    [b'ab', b'cd', b'e']
    """
    pending = bytearray()
    for part in parts:
        view = memoryview(part).cast("B")
        while view:
            take = size - len(pending)
            pending += view[:take]
            view = view[take:]
            if len(pending) == size:
                yield bytes(pending)
                pending.clear()
    if pending:
        yield bytes(pending)
