"""The inference stream's errors: a stream that ended under a request fails it as UNAVAILABLE (what the replicas
route around), never with a bare asyncio error."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from inference_server import stream as stream_module
from inference_server.stream import InferStream, StreamError
from tests.support.waiting import until


def _request(policy: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=policy, model_version="1")
    observation = np.zeros((1, 11), np.float32)
    request.inputs.add(name="observation", datatype="FP32", shape=observation.shape)
    request.raw_input_contents.append(observation.tobytes())
    request.outputs.add(name="action")
    return request


def test_a_call_that_ended_before_its_reader_noticed_is_replaced_by_the_next_write(triton):
    async def scenario():
        stream = InferStream(triton.url)
        try:
            await stream.infer(_request(triton.policy), timeout_s=30)
            call = stream._call
            call.cancel()  # the call ends (as when its server is killed); its reader has not run since
            reply = await stream.infer(_request(triton.policy), timeout_s=30)
            assert reply.model_name == triton.policy and stream._call is not call
        finally:
            await stream.close()

    asyncio.run(scenario())


def test_a_write_to_a_call_that_ends_under_it_is_unavailable(triton):
    async def scenario():
        stream = InferStream(triton.url)
        opened = stream._open

        def opened_then_ended():  # the call ends between the write's start and its message going out
            call = opened()
            call.cancel()
            return call

        try:
            stream._open = opened_then_ended
            with pytest.raises(StreamError) as error:
                await stream.infer(_request(triton.policy), timeout_s=30)
            assert error.value.code == "UNAVAILABLE" and "RPC already finished" in error.value.detail
            stream._open = opened
            reply = await stream.infer(_request(triton.policy), timeout_s=30)
            assert reply.model_name == triton.policy
        finally:
            await stream.close()

    asyncio.run(scenario())


def test_a_deadline_that_passes_mid_write_fails_that_request_alone(triton):
    """A request whose deadline passes while its message is still being written (a large one here; on a loaded
    machine any) gets DEADLINE_EXCEEDED; the stream it shares stays open, so the requests in flight beside it are
    answered. (gRPC cancels the whole call when a write is cancelled: the write must never be.)"""
    async def scenario():
        stream = InferStream(triton.url)
        try:
            await stream.infer(_request(triton.policy), timeout_s=30)
            call = stream._call
            big = _request(triton.policy)  # 32 MB: refused by Triton's shape check, long after its deadline
            big.raw_input_contents[0] = bytes(32 << 20)
            beside = [asyncio.create_task(stream.infer(_request(triton.policy), timeout_s=30)) for _ in range(8)]
            with pytest.raises(StreamError) as error:
                await stream.infer(big, timeout_s=0.001)
            assert error.value.code == "DEADLINE_EXCEEDED", error.value
            replies = await asyncio.gather(*beside, return_exceptions=True)
            assert all(not isinstance(r, BaseException) and r.model_name == triton.policy for r in replies), replies
            assert stream._call is call and not call.cancelled(), "the shared stream was cancelled"
            after = await stream.infer(_request(triton.policy), timeout_s=30)
            assert after.model_name == triton.policy
        finally:
            await stream.close()

    asyncio.run(scenario())


def _stopped(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def test_a_write_stalled_on_a_stopped_triton_resets_the_stream(triton, monkeypatch):
    """Triton stops reading (SIGSTOP; a hung server or a partition alike): a write that has not gone out after
    STALLED_WRITE_S resets the stream, failing the requests sent on it as UNAVAILABLE; a request queued behind the
    stalled write goes out on a new stream, answered once Triton reads again."""
    monkeypatch.setattr(stream_module, "STALLED_WRITE_S", 1.0)

    async def scenario():
        stream = InferStream(triton.url)
        try:
            await stream.infer(_request(triton.policy), timeout_s=30)
            call = stream._call
            big = _request(triton.policy)
            big.raw_input_contents[0] = bytes(32 << 20)
            os.kill(triton.server.pid, signal.SIGSTOP)
            try:
                await until(lambda: _stopped(triton.server.pid), "Triton stopped (SIGSTOP)")
                sent = asyncio.create_task(stream.infer(_request(triton.policy), timeout_s=30))
                await until(lambda: call in stream._sent_on.values(),  # on the stream: its reply will not come
                            "a request written on the stream")
                with pytest.raises(StreamError) as late:
                    await stream.infer(big, timeout_s=0.2)
                assert late.value.code == "DEADLINE_EXCEEDED", late.value
                behind = asyncio.create_task(stream.infer(_request(triton.policy), timeout_s=30))
                with pytest.raises(StreamError) as reset:
                    await sent
                assert reset.value.code == "UNAVAILABLE" and "stalled" in reset.value.detail, reset.value
            finally:
                os.kill(triton.server.pid, signal.SIGCONT)
            assert (await behind).model_name == triton.policy
            assert stream._call is not call
            reply = await stream.infer(_request(triton.policy), timeout_s=30)
            assert reply.model_name == triton.policy
        finally:
            await stream.close()

    asyncio.run(scenario())
