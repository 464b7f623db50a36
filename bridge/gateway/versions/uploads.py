"""A Publish's bytes streamed to a file as they arrive, hashed on the way, never held whole in memory.

    uploads = Uploads(repo.root / ".incoming")   # removes what a killed gateway left there
    async with uploads.receive(header, chunks) as upload:   # UploadError: wrong size, a non-data chunk
        upload.path, upload.size, upload.sha256           # complete and fsynced; the digest of what arrived
        upload.scratch                                     # a folder beside it (a version built apart)
    # the file and its scratch folder are gone, whatever happened inside (an error, a cancelled call)

The file is written as `<pid>-<id>.part`, fsynced and renamed to `<pid>-<id>.upload` once every byte the
header announced has arrived: no half-written upload is ever taken for a whole one. Writing and hashing run
in threads at a lower CPU priority, 1 MiB at a time, so the event loop (the sessions' steps) never waits on them.

A cancelled receive still waits for its thread jobs (`finished`): gRPC cancels the Publish servicer as soon as its
client is gone, often just after the stream ended, while the removal of the file is queued for a thread; a job
awaited through `asyncio.to_thread` would be dropped then and the file left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import threading
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bridge.common.errors import InvalidArgument
from protos import policies_pb2

FLUSH_BYTES = 1 << 20  # received bytes written (and hashed) together, in a thread
NICE = 10  # the writing threads' CPU priority (Linux: per thread), below the gateway's event loop and the sims


def _lower_priority() -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)


_POOL = ThreadPoolExecutor(2, thread_name_prefix="upload", initializer=_lower_priority)


class UploadError(InvalidArgument):
    """The stream does not carry what its header announced."""


@dataclass(frozen=True)
class Upload:
    """A whole upload on disk: `sha256` is the digest of its bytes (the header's claim is the gate's to judge)."""

    path: Path
    size: int
    sha256: str
    scratch: Path

    def read(self) -> bytes:
        """The bytes (for small versions and imported files, which are checked in memory)."""
        return self.path.read_bytes()


class Uploads:
    """Receives Publish streams into `folder` (see the module docstring)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.removed = self._sweep()

    @contextlib.asynccontextmanager
    async def receive(self, header: policies_pb2.PublishHeader,
                      chunks: AsyncIterator[policies_pb2.PublishChunk]) -> AsyncIterator[Upload]:
        stem = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        part, whole, scratch = (self.folder / f"{stem}{s}" for s in (".part", ".upload", ".scratch"))
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        hasher, pending, held, received = hashlib.sha256(), [], 0, 0
        try:
            try:
                async for chunk in chunks:
                    if chunk.WhichOneof("kind") != "data":
                        raise UploadError("after the header, a Publish stream carries only data chunks")
                    received += len(chunk.data)
                    if received > header.size:
                        raise UploadError(f"more than the {header.size} bytes the header announced")
                    pending.append(chunk.data)
                    held += len(chunk.data)
                    if held >= FLUSH_BYTES:
                        await finished(_POOL.submit(_append, fd, hasher, pending))
                        pending, held = [], 0
                if received != header.size:
                    raise UploadError(f"received {received} bytes, the header announced {header.size}")
                digest = await finished(_POOL.submit(_finish, fd, hasher, pending, part, whole))
            finally:
                os.close(fd)  # no write is running: `finished` waited for it, cancelled or not
            yield Upload(path=whole, size=received, sha256=digest, scratch=scratch)
        finally:
            await finished(_POOL.submit(_remove, part, whole, scratch))

    def _sweep(self) -> list[str]:
        """Remove uploads whose gateway process is gone (killed mid-publish); another live gateway's stay."""
        removed = []
        for path in self.folder.iterdir():
            pid = path.name.split("-", 1)[0]
            if pid.isdigit() and _alive(int(pid)) and int(pid) != os.getpid():
                continue
            _remove(path)
            removed.append(path.name)
        return removed


async def finished(job: Future | asyncio.Future):
    """The result of `job` (a thread's or a child process's), awaited to its end even when the awaiting task is
    cancelled meanwhile; the cancellation is raised once the job has ended. For work that must not be dropped
    (a cleanup) or outlived (a write into a file about to be closed, a child writing into a folder about to be
    removed).

        await finished(_POOL.submit(_remove, part))   # the file is gone when this returns or raises
    """
    job = asyncio.wrap_future(job)  # never cancelled here: asyncio.wait leaves the futures it waits on alone
    cancelled: asyncio.CancelledError | None = None
    while not job.done():
        try:
            await asyncio.wait([job])
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        job.exception()  # retrieved (no "never retrieved" warning); the cancellation is what the caller gets
        raise cancelled
    return job.result()


def _append(fd: int, hasher, parts: list[bytes]) -> None:
    for part in parts:
        hasher.update(part)  # releases the GIL on large buffers, as does the write
        view = memoryview(part)
        while view:
            view = view[os.write(fd, view):]


def _finish(fd: int, hasher, parts: list[bytes], part: Path, whole: Path) -> str:
    if parts:
        _append(fd, hasher, parts)
    os.fsync(fd)
    os.rename(part, whole)
    return hasher.hexdigest()


def _remove(*paths: Path) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
