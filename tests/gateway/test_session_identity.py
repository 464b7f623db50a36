"""Session identity across gateway restarts (issue 14, point 4): ids the gateway gives never repeat,
a known id learns `Welcome.next_step`, and `durable_through` reports fsynced steps only."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import numpy as np
import pytest

from bridge.experience import read_transitions, segment
from protos import bridge_pb2
from protos.codec import encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import gateway_process, running_gateway
from tests.support.waiting import until


def _obs(step: int) -> list:
    return [encode("observation", np.full(11, 0.01 * step, np.float32))]


def _logged_steps(log_dir) -> dict[str, list[int]]:
    steps: dict[str, list[int]] = {}
    for t in read_transitions(log_dir):
        steps.setdefault(t.session, []).append(t.step)
    return steps


def test_durable_through_never_passes_the_fsynced_steps(triton, tmp_path, monkeypatch):
    """The writer is paused before its fsync: steps are appended (the log's last step moves on) but
    no reply, neither live nor the Replay duplicate path, reports them durable until the fsync ran."""
    fsync_open = threading.Event()
    fsync_open.set()
    real = segment._fdatasync

    def paused_fdatasync(fd: int) -> None:
        assert fsync_open.wait(60), "the test never reopened fsync"
        real(fd)

    monkeypatch.setattr(segment, "_fdatasync", paused_fdatasync)
    log_dir = tmp_path / "experience"

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", experience_dir=log_dir, fsync_interval_ms=0) as gw:
            async with RawSession(gw.address, hello("r1", obs=OBS, act=ACT)) as s:
                assert s.welcome.durable_through == 0 and s.welcome.next_step == 0
                for step in range(5):
                    assert (await s.step(np.zeros(11, np.float32), step=step)).WhichOneof("kind") == "action"
                await until(lambda: gw.experience.durable_step("r1") == 3,  # step 4 waits for its successor
                            "r1's step 3 durable")
                fsync_open.clear()
                replies = [await s.step(np.zeros(11, np.float32), step=step) for step in range(5, 10)]
                await until(lambda: gw.experience.stats.next_offset >= 9, "9 transitions appended")
                assert gw.experience.last_step("r1") == 8          # appended ...
                assert [r.durable_through for r in replies] == [4] * 5  # ... but not reported durable
                replay = bridge_pb2.Replay(observation=bridge_pb2.Observation(step=6, tensors=_obs(6)),
                                           action=replies[1].action)
                await s.call.write(bridge_pb2.ClientMessage(replay=replay))
                dup = await s.call.read()
                assert dup.replayed.duplicate and dup.durable_through == 4
                fsync_open.set()
                async def durable_through_9() -> bool:  # once the fsync ran, the replies say so
                    return (await s.step(np.zeros(11, np.float32))).durable_through >= 9

                await until(durable_through_9, "a reply saying step 9 is durable", period=0.01)
                assert gw.experience.durable_step("r1") >= 8

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_restarted_gateway_serves_an_id_less_client_from_step_0_and_tells_a_known_id_its_next_step(
        triton, tmp_path, unused_port):
    log_dir = tmp_path / "experience"
    address = f"127.0.0.1:{unused_port}"
    log_path = tmp_path / "gateway.log"

    async def before_crash() -> str:
        async with RawSession(address, hello("", obs=OBS, act=ACT)) as anon, \
                RawSession(address, hello("r1", obs=OBS, act=ACT)) as known:
            assert known.welcome.next_step == 0
            for step in range(20):
                assert (await anon.step(np.zeros(11, np.float32), step=step)).WhichOneof("kind") == "action"
            for step in range(10):
                assert (await known.step(np.zeros(11, np.float32), step=step)).WhichOneof("kind") == "action"
            # on disk before the crash: anon's steps 0..18 and r1's 0..8 (step t is logged when t+1 arrives)
            await until(lambda: (lambda s: s.get(anon.welcome.session_id, [])[-1:] == [18]
                                 and s.get("r1", [])[-1:] == [8])(_logged_steps(log_dir)), "steps on disk",
                        period=0.05)
            return anon.welcome.session_id

    async def after_restart(old_id: str) -> None:
        async with RawSession(address, hello("", obs=OBS, act=ACT)) as anon:
            assert anon.welcome.session_id and anon.welcome.session_id != old_id
            assert anon.welcome.next_step == 0 and anon.welcome.durable_through == 0
            for step in range(5):  # a power-cycled edge node counts from 0 again: served at once
                reply = await anon.step(np.zeros(11, np.float32), step=step)
                assert reply.WhichOneof("kind") == "action", reply
        async with RawSession(address, hello("r1", obs=OBS, act=ACT)) as known:
            assert known.welcome.next_step == 9 and known.welcome.durable_through == 9
            assert (await known.step(np.zeros(11, np.float32), step=9)).WhichOneof("kind") == "action"
            late = await known.step(np.zeros(11, np.float32), step=5)
            assert late.WhichOneof("kind") == "error" and late.error.code == bridge_pb2.StepError.OUT_OF_ORDER

    with gateway_process(triton.url, log_path, "--experience-dir", log_dir, port=unused_port) as first:
        old_id = asyncio.run(before_crash())
        os.kill(first.pid, signal.SIGKILL)
        first.proc.wait(30)
    with gateway_process(triton.url, log_path, "--experience-dir", log_dir, port=unused_port):
        asyncio.run(after_restart(old_id))
