"""Camera frames decoded off the event loop: a small thread pool shared by a gateway's sessions.

    images = ImageDecoder(threads=2)             # --decode-threads; its threads start with the first frame
    arrays = await images.decode(specs, obs.tensors)   # {name: uint8 (H, W, C)} of the encoded tensors
    images.close()

The JPEG and PNG libraries (protos.codec: simplejpeg, Pillow) release the GIL while they decode, so the event
loop serves other sessions meanwhile, and `threads` bounds the CPU the gateway spends on images. A step's
frames decode in parallel; each is checked against its spec (name, encoding, dtype, shape, size) before its
bytes are touched. A frame that does not decode, or decodes to another shape, raises `TensorError` naming
it: the session answers that step with a StepError(INVALID_OBSERVATION) and goes on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from protos.codec import RAW, Spec, decode_image
from protos.tether.v1 import tensor_pb2

__all__ = ["DEFAULT_THREADS", "ImageDecoder", "encoded"]

DEFAULT_THREADS = max(1, min(4, (os.cpu_count() or 1) // 2))  # half the cores, at most 4


def encoded(specs: Iterable[Spec]) -> dict[str, Spec]:
    """The specs of `specs` whose tensors travel encoded (JPEG, PNG), by name."""
    return {s.name: s for s in specs if s.encoding != RAW}


class ImageDecoder:
    """A bounded pool of `threads` decoding encoded tensors (see the module docstring)."""

    def __init__(self, *, threads: int = DEFAULT_THREADS):
        if threads < 1:
            raise ValueError(f"decode threads must be >= 1, got {threads}")
        self.threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tether-images")
        self.decoded = 0  # frames decoded, and frames refused (corrupt, another shape)
        self.failed = 0

    async def decode(self, specs: Mapping[str, Spec],
                     tensors: Iterable[tensor_pb2.Tensor]) -> dict[str, np.ndarray]:
        """The arrays of the encoded tensors among `tensors` whose name is in `specs`; others are left to
        `check_all` (it names a tensor that is missing, unknown, sent twice or in another encoding)."""
        loop = asyncio.get_running_loop()
        names, jobs = [], []
        for t in tensors:
            spec = specs.get(t.name)
            if t.encoding == RAW or spec is None or t.name in names:
                continue
            spec.check_declared(t)  # encoding, dtype, shape and a size bound before the bytes are touched
            names.append(t.name)
            jobs.append(loop.run_in_executor(self._pool, decode_image, t))
        if not jobs:
            return {}
        results = await asyncio.gather(*jobs, return_exceptions=True)
        arrays = {name: r for name, r in zip(names, results, strict=True) if not isinstance(r, BaseException)}
        self.decoded += len(arrays)
        self.failed += len(results) - len(arrays)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return arrays

    def close(self) -> None:
        """Stop the threads (frames being decoded finish first)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
