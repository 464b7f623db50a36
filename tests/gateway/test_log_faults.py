"""A disk fault under a real gateway process (issue 14, point 5): ENOSPC injected into the log's file
layer (TETHER_LOG_FAULTS) while two sessions act over gRPC. Every step is answered, durable_through
stands still during the fault, FleetStatus.logging says degraded, and once the disk takes writes
again every transition is in the log, in order."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request

import grpc
import numpy as np
import pytest

from bridge.experience import read_transitions
from bridge.experience.segment import is_finished, list_segments
from protos import fleet_pb2, fleet_pb2_grpc
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import gateway_process
from tests.support.waiting import until, wait_until

pytestmark = pytest.mark.slow
POLL = {"timeout": 60.0, "period": 0.02}  # each poll of a state asks the gateway over gRPC


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def test_enospc_with_two_sessions_acting_throughout_then_logging_resumes(triton, tmp_path, unused_port):
    log_dir, fault = tmp_path / "experience", tmp_path / "fault"
    log_path = tmp_path / "gateway.log"
    address = f"127.0.0.1:{unused_port}"
    replies: dict[str, list[tuple[int, str, int]]] = {"arm-a": [], "arm-b": []}  # (step, kind, durable_through)

    async def act(session: RawSession, name: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            reply = await session.step(np.zeros(11, np.float32))
            replies[name].append((session.step_index - 1, reply.WhichOneof("kind"), reply.durable_through))
            await asyncio.sleep(0.003)

    async def scenario() -> dict[str, int]:
        channel = grpc.aio.insecure_channel(address)
        fleet = fleet_pb2_grpc.FleetStub(channel)

        async def logging_is(prefix: str):
            state = (await fleet.Status(fleet_pb2.StatusRequest(), timeout=10)).logging
            return state if state.startswith(prefix) else None

        async with RawSession(address, hello("arm-a", obs=OBS, act=ACT)) as a, \
                RawSession(address, hello("arm-b", obs=OBS, act=ACT)) as b:
            stop = asyncio.Event()
            tasks = [asyncio.create_task(act(a, "arm-a", stop)), asyncio.create_task(act(b, "arm-b", stop))]

            async def durable_at_least(n: int) -> bool:
                for task in tasks:
                    if task.done():
                        task.result()  # a session that broke fails the test here
                return all(r and r[-1][2] >= n for r in replies.values())

            await until(lambda: durable_at_least(5), "steps durable before the fault", **POLL)
            assert await logging_is("ok")
            fault.write_text("ENOSPC")
            state = await until(lambda: logging_is("degraded: ENOSPC"), "logging degraded", **POLL)
            marks = {name: len(r) for name, r in replies.items()}
            shown = await asyncio.to_thread(_get, f"{console}/api/state")
            assert json.loads(shown)["gateway"]["logging"].startswith("degraded: ENOSPC")  # the console's view
            assert "tether_experience_degraded 1.0" in await asyncio.to_thread(_get, f"{console}/metrics")

            async def acted_on(n: int) -> bool:
                await durable_at_least(0)
                return all(len(r) >= marks[name] + n for name, r in replies.items())

            await until(lambda: acted_on(40), "sessions acting during the fault", **POLL)
            assert await logging_is("degraded: ENOSPC")  # still: the writer's retries fail too
            # from the second reply on after degraded showed: acks the writer had sent before its failed write
            # are on the gateway's loop by then (a reply in flight at the mark may predate them)
            during = {name: r[marks[name] + 2:] for name, r in replies.items()}
            fault.unlink()
            await until(lambda: logging_is("ok"), "logging resumed", **POLL)
            assert "tether_experience_degraded 0.0" in await asyncio.to_thread(_get, f"{console}/metrics")
            last_fault_step = {name: r[-1][0] for name, r in during.items()}
            await until(lambda: durable_at_least(max(last_fault_step.values()) + 1), "durable again", **POLL)
            stop.set()
            await asyncio.gather(*tasks)
        await channel.close()
        for name, r in during.items():
            frozen = {durable for _, _, durable in r}
            assert len(frozen) == 1, f"{name}: durable_through moved during the fault: {sorted(frozen)}"
        assert "ENOSPC" in state and "transitions kept" in state
        return {name: r[-1][0] + 1 for name, r in replies.items()}

    with gateway_process(triton.url, log_path, "--experience-dir", log_dir, "--console-port", "0", port=unused_port,
                         env={"TETHER_LOG_FAULTS": str(fault)}, grace_s=30) as gateway:
        shown = wait_until(lambda: re.search(r"^console on (\S+)", log_path.read_text(), re.M), "the console's URL")
        console = shown.group(1).rstrip("/")
        assert console.startswith("http://127.0.0.1:"), console
        sent = asyncio.run(scenario())
    assert gateway.proc.returncode == 0, log_path.read_text()[-3000:]
    for name, r in replies.items():
        kinds = {kind for _, kind, _ in r}
        assert kinds == {"action"}, f"{name}: every step answered with an action, got {kinds}"
        assert [step for step, _, _ in r] == list(range(len(r)))
    logged: dict[str, list[int]] = {"arm-a": [], "arm-b": []}
    offsets = []
    for t in read_transitions(log_dir):
        logged[t.session].append(t.step)
        offsets.append(t.offset)
    assert offsets == list(range(len(offsets)))
    for name, steps in logged.items():  # step t is logged when t+1 arrives: all but the last sent
        assert steps == list(range(sent[name] - 1)), f"{name}: {len(steps)} logged of {sent[name] - 1}"
    assert all(is_finished(p) for _, p in list_segments(log_dir))
    assert "logging degraded" in log_path.read_text() and "writing resumed" in log_path.read_text()


def test_tether_gateway_log_retention_flags_prune_the_oldest_finished_segments(triton, tmp_path):
    from bridge.experience import ExperienceLog
    from tests.experience.helpers import transition

    log_dir = tmp_path / "experience"

    async def fill():
        async with ExperienceLog(log_dir, segment_bytes=64 << 10) as log:
            await asyncio.gather(*[log.append(transition("old", i, obs_dim=2000)) for i in range(200)])

    asyncio.run(fill())
    before = [p for _, p in list_segments(log_dir)]
    assert sum(p.stat().st_size for p in before) > 1 << 20 and len(before) > 12
    gateway_log = tmp_path / "gateway.log"
    with gateway_process(triton.url, gateway_log, "--experience-dir", log_dir, "--log-retention-mb", "0.5",
                         "--log-retention-hours", "48", grace_s=30) as gateway:
        wait_until(lambda: "retention deleted" in gateway_log.read_text() or gateway.proc.poll() is not None,
                   "the retention's first pass (logged once it is done)", timeout=30)
        assert gateway.proc.poll() is None, gateway_log.read_text()
        assert sum(p.stat().st_size for _, p in list_segments(log_dir)) <= 512 << 10
        after = [p for _, p in list_segments(log_dir)]
        assert after == before[len(before) - len(after):] and before[-1] in after  # oldest first, newest kept
        steps = [t.step for t in read_transitions(log_dir)]
        assert steps == list(range(steps[0], 200)) and steps[0] > 0
