"""`gateway.versions.uploads`: a Publish stream written to a file as it arrives (no gateway, no Triton): the digest
of what arrived, a whole file only under its final name, nothing left behind however the receive ends."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys

import grpc
import pytest

from bridge.gateway.versions.uploads import FLUSH_BYTES, UploadError, Uploads
from protos import policies_pb2


async def stream(*pieces: bytes | policies_pb2.PublishHeader):
    for piece in pieces:
        if isinstance(piece, bytes):
            yield policies_pb2.PublishChunk(data=piece)
        else:
            yield policies_pb2.PublishChunk(header=piece)


def header(size: int) -> policies_pb2.PublishHeader:
    return policies_pb2.PublishHeader(policy="p", format="safetensors", size=size, sha256="0" * 64)


def test_a_stream_lands_whole_under_its_final_name_with_its_digest_and_is_removed_after(tmp_path):
    uploads = Uploads(tmp_path / ".incoming")
    data = os.urandom(3 * FLUSH_BYTES + 12345)
    pieces = [data[i:i + 70000] for i in range(0, len(data), 70000)]

    async def main():
        async with uploads.receive(header(len(data)), stream(*pieces)) as upload:
            assert upload.path.name.endswith(".upload") and upload.path.read_bytes() == data
            assert upload.size == len(data) and upload.sha256 == hashlib.sha256(data).hexdigest()
            assert not any(p.name.endswith(".part") for p in uploads.folder.iterdir())
            upload.scratch.mkdir()
            (upload.scratch / "policy.pt").write_bytes(b"built")
        return upload

    upload = asyncio.run(main())
    assert not upload.path.exists() and not upload.scratch.exists() and list(uploads.folder.iterdir()) == []


@pytest.mark.parametrize(("announced", "pieces", "message"), [
    (10, [b"x" * 4], "received 4 bytes, the header announced 10"),
    (4, [b"x" * 3, b"x" * 3], "more than the 4 bytes the header announced"),
    (4, [b"xx", header(2)], "only data chunks"),
])
def test_a_stream_that_is_not_what_its_header_announced_is_refused_and_leaves_nothing(tmp_path, announced, pieces,
                                                                                      message):
    uploads = Uploads(tmp_path / ".incoming")

    async def main():
        async with uploads.receive(header(announced), stream(*pieces)):
            raise AssertionError("an incomplete upload was handed on")

    with pytest.raises(UploadError, match=message) as refused:
        asyncio.run(main())
    assert refused.value.status == grpc.StatusCode.INVALID_ARGUMENT
    assert list(uploads.folder.iterdir()) == []


def test_a_receive_cancelled_mid_stream_leaves_nothing(tmp_path):
    uploads = Uploads(tmp_path / ".incoming")
    arrived = asyncio.Event()

    async def stalled():
        yield policies_pb2.PublishChunk(data=b"x" * (2 * FLUSH_BYTES))
        arrived.set()
        await asyncio.Event().wait()  # the client went quiet, then away

    async def main():
        async def receive():
            async with uploads.receive(header(10 * FLUSH_BYTES), stalled()):
                raise AssertionError("an incomplete upload was handed on")

        task = asyncio.create_task(receive())
        await arrived.wait()
        assert [p.suffix for p in uploads.folder.iterdir()] == [".part"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert list(uploads.folder.iterdir()) == []


def test_a_receive_cancelled_just_after_its_stream_ended_has_removed_the_file_when_it_ends(tmp_path):
    # what gRPC's aio server does when a client dies: the stream ends, then the servicer is cancelled at its next
    # await, here the removal's (a SIGKILLed publisher in tests/gateway/test_large_versions.py)
    uploads = Uploads(tmp_path / ".incoming")

    async def main():
        async def cut_off():
            yield policies_pb2.PublishChunk(data=b"x" * (2 * FLUSH_BYTES))
            asyncio.get_running_loop().call_soon(task.cancel)  # the client is gone

        async def receive():
            async with uploads.receive(header(10 * FLUSH_BYTES), cut_off()):
                raise AssertionError("an incomplete upload was handed on")

        task = asyncio.create_task(receive())
        with pytest.raises(asyncio.CancelledError):
            await task
        assert list(uploads.folder.iterdir()) == []  # when the receive ended, not some time later

    asyncio.run(main())


def test_what_a_dead_gateway_left_is_removed_and_a_live_ones_uploads_are_kept(tmp_path):
    folder = tmp_path / ".incoming"
    folder.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (folder / f"{dead}-abc.part").write_bytes(b"half")
        (folder / f"{dead}-abd.scratch").mkdir()
        (folder / f"{live.pid}-abe.part").write_bytes(b"in flight")
        (folder / "stray").write_bytes(b"?")
        uploads = Uploads(folder)
        assert sorted(uploads.removed) == sorted([f"{dead}-abc.part", f"{dead}-abd.scratch", "stray"])
        assert [p.name for p in folder.iterdir()] == [f"{live.pid}-abe.part"]
    finally:
        live.kill()
        live.wait()
