"""`tether view` as a process beside a real gateway (the session's Triton, sessions stepping with a JPEG camera), spoken
to by a plain websockets client (tests/support/foxglove_client.py): live messages that decode with the advertised
schemas, e-stops from tether.v1.Fleet, viewer tokens, and a slow viewer that costs the loop nothing."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import websockets
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from bridge.client import FleetClient
from bridge.security.tokens import TokenStore
from protos import bridge_pb2, codec
from protos.codec import Spec
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.foxglove_client import FoxgloveClient, slow_viewer
from tests.support.gateways import running_gateway
from tests.support.waiting import until

ROOT = Path(__file__).resolve().parents[2]
CAMERA = Spec("top", np.uint8, (96, 128, 3), encoding=codec.JPEG)
KINDS = ("camera/top", "state", "action", "hops", "estop")


def frame(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, CAMERA.shape, dtype=np.uint8)


class Robot:
    """One session stepping as fast as its replies come (sequential steps), its round trips kept per phase."""

    def __init__(self, address: str, name: str):
        self.address, self.name = address, name
        self.steps, self.rtts, self.phase, self.stop = 0, {}, "warmup", asyncio.Event()
        self.late = 0  # steps answered DEADLINE_EXCEEDED
        self.frames = [codec.encode_image("top", frame(i)) for i in range(8)]

    async def run(self) -> None:
        rng = np.random.default_rng(0)
        async with RawSession(self.address, hello(self.name, obs=(*OBS, CAMERA), act=ACT)) as s:
            while not self.stop.is_set():
                obs = codec.encode("observation", rng.standard_normal(11).astype(np.float32))
                began = time.perf_counter()
                reply = await s.send([obs, self.frames[self.steps % 8]],
                                     step_type=bridge_pb2.FIRST if self.steps == 0 else bridge_pb2.MID)
                self.rtts.setdefault(self.phase, []).append(time.perf_counter() - began)
                if reply.WhichOneof("kind") == "error":  # a step past the gateway's deadline (a loaded machine)
                    assert reply.error.code == bridge_pb2.StepError.DEADLINE_EXCEEDED, reply  # that step's, no more
                    self.late += 1
                else:
                    assert reply.WhichOneof("kind") == "action", reply
                self.steps += 1


@contextlib.asynccontextmanager
async def robots(address: str, *names: str):
    fleet = [Robot(address, n) for n in names]
    tasks = [asyncio.create_task(r.run()) for r in fleet]
    try:
        await until(lambda: all(r.steps > 3 for r in fleet) or any(t.done() for t in tasks), "steps")
        yield fleet
    finally:
        for r in fleet:
            r.stop.set()
        await asyncio.gather(*tasks)


@contextlib.asynccontextmanager
async def view_process(gateway: str, log: Path, *args: str):
    """`tether view --gateway G --port 0 ARGS...`; yields its first stdout line (JSON: url, stats, ...)."""
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tether", "view", "--gateway", gateway, "--port", "0",
                                 "--status-every", "1", *args], stdout=subprocess.PIPE, stderr=err, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert line, f"tether view exited {proc.wait()}: {log.read_text()[-2000:]}"
        yield json.loads(line)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def get_stats(info: dict, token: str | None = None) -> dict:
    request = urllib.request.Request(info["stats"], headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


async def stats(info: dict, token: str | None = None) -> dict:
    return await asyncio.to_thread(get_stats, info, token)


def decoder(advertisement: dict):
    if advertisement["encoding"] == "json":
        return json.loads
    pool = descriptor_pool.DescriptorPool()
    for fd in descriptor_pb2.FileDescriptorSet.FromString(base64.b64decode(advertisement["schema"])).file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(advertisement["schemaName"])).FromString


async def pressed(call, tries: int = 30):
    """An operator's e-stop or release, pressed again while the gateway answers UNAVAILABLE: its registry did not
    record it within the gateway's wait (a loaded machine; the e-stop holds meanwhile). The registry's state
    decides when the test goes on, not its speed."""
    for _ in range(tries):
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
    raise AssertionError(f"the registry did not record it in {tries} presses")


def run(coro, timeout: float = 240):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_a_viewer_sees_each_robot_live_with_its_e_stop(triton, tmp_path):
    async def main():
        async with running_gateway(triton.url, policy="tiny", experience_dir=tmp_path / "experience") as gw, \
                view_process(gw.address, tmp_path / "view.log") as info, \
                robots(gw.address, "arm_1", "arm_2") as fleet, \
                FoxgloveClient.connect(info["url"]) as viewer:
            wanted = {f"/{r.name}/{k}" for r in fleet for k in KINDS} | {"/log"}
            channels = await viewer.wait_channels(lambda ch: wanted <= set(ch))
            assert channels["/arm_1/camera/top"]["schemaName"] == "foxglove.CompressedImage"
            await viewer.subscribe(sorted(wanted))
            decode = {topic: decoder(channels[topic]) for topic in wanted}
            seen: dict[str, object] = {}
            while not {t for t in wanted if "estop" not in t and t != "/log"} <= set(seen):
                topic, log_time, payload = await viewer.next_message()
                seen[topic] = decode[topic](payload)
                assert abs(log_time - time.time_ns()) < 60e9  # the step's own (wall clock) time
            image = seen["/arm_2/camera/top"]
            assert image.format == "jpeg" and image.data in {bytes(f.data) for f in fleet[1].frames}
            assert len(seen["/arm_1/state"]["observation"]["observation"]) == 11
            action = seen["/arm_1/action"]
            assert action["policy"] == "tiny" and action["policy_version"] == 1 and len(action["action"]["action"]) == 3
            assert seen["/arm_1/hops"]["gateway_ms"] > 0

            async with FleetClient(gw.address, aio=True, operator="alice") as ops:  # an e-stop shows, then goes
                await pressed(lambda: ops.estop(session_id="arm_1", reason="test"))
                estop = await _next(viewer, "/arm_1/estop", decode, lambda m: m["estopped"])
                assert estop["estop_id"]
                log = await _next(viewer, "/log", decode, lambda m: "e-stop latched" in m.message)
                assert log.name == "arm_1" and log.level == 4  # ERROR
                await pressed(lambda: ops.release(session_id="arm_1", reason="test"))
                await _next(viewer, "/arm_1/estop", decode, lambda m: not m["estopped"])

            s = await stats(info)
            assert s["connected"] and s["viewers"][0]["sent"] > 10 and s["channels"] == 11
            assert s["acked_through"] <= gw.experience.durable_offset
            end = gw.experience.durable_offset
            await until(lambda: _acked(info, end), "the view acking the log's end")

    run(main())


async def _acked(info: dict, offset: int, token: str | None = None) -> bool:
    return (await stats(info, token))["acked_through"] >= offset


async def _next(viewer: FoxgloveClient, topic: str, decode: dict, matches, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        got_topic, _, payload = await viewer.next_message(timeout=max(deadline - time.monotonic(), 0.01))
        if got_topic == topic and matches(message := decode[topic](payload)):
            return message


def test_a_view_with_tokens_refuses_a_viewer_without_one_and_starts_at_the_logs_end(triton, tmp_path):
    store = TokenStore(tmp_path / "view-tokens.json")
    token = store.add("watcher", role="viewer")

    async def main():
        async with running_gateway(triton.url, policy="tiny", experience_dir=tmp_path / "experience") as gw:
            async with robots(gw.address, "arm_1") as (robot,):
                await until(lambda: robot.steps >= 50, "50 steps before the view starts")
            await until(lambda: gw.experience.durable_offset >= 50, "them durable")
            before = gw.experience.durable_offset
            async with view_process(gw.address, tmp_path / "view.log", "--tokens",
                                    str(tmp_path / "view-tokens.json")) as info:
                await _refusals(info, token)
                async with robots(gw.address, "arm_2"):
                    await until(lambda: _acked(info, before + 20, token), "the view acking new steps")
                s = await stats(info, token)
                assert s["received"] <= s["acked_through"] - before, (before, s)  # none from before it started

    run(main())


async def _refusals(info: dict, token: str) -> None:
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with FoxgloveClient.connect(info["url"]):
            pass
    assert refused.value.response.status_code == 401
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with FoxgloveClient.connect(info["url"], "watcher.not-the-secret"):
            pass
    assert refused.value.response.status_code == 401
    async with FoxgloveClient.connect(info["url"], token) as viewer:
        assert viewer.server_info["op"] == "serverInfo"
    assert (await stats(info, token))["refused"] == 2


def test_the_view_outlives_a_gateway_restart_and_resumes_where_it_was(triton, tmp_path):
    from bridge.common.processes import free_port

    port = free_port()
    config = dict(policy="tiny", experience_dir=tmp_path / "experience", port=port)

    async def main():
        async with running_gateway(triton.url, **config) as gw:
            async with view_process(gw.address, tmp_path / "view.log") as info:
                async with FoxgloveClient.connect(info["url"]) as viewer:
                    async with robots(gw.address, "arm_1"):
                        await viewer.wait_channels(lambda ch: "/arm_1/state" in ch)
                        await viewer.subscribe(["/arm_1/state"])
                        await viewer.next_message(topic="/arm_1/state")
                    end = gw.experience.durable_offset
                    await until(lambda: _acked(info, end), "the view acking the first gateway's steps")
                    await gw.stop(grace=0.1)
                    await until(lambda: _disconnected(info), "the view noticing the gateway gone")
                    async with running_gateway(triton.url, **config) as again, robots(again.address, "arm_2"):
                        await until(lambda: _acked(info, end + 20), "the view acking the restarted gateway's steps")
                        await viewer.wait_channels(lambda ch: "/arm_2/state" in ch)
                        await viewer.subscribe(["/arm_2/state"])
                        assert json.loads((await viewer.next_message(topic="/arm_2/state"))[2])["step"] >= 0
                    s = await stats(info)
                    assert s["reconnects"] >= 1 and s["received"] <= s["acked_through"], s
                    assert s["viewers"][0]["id"] == 1  # the same viewer all along

    run(main())


async def _disconnected(info: dict) -> bool:
    return not (await stats(info))["connected"]


def test_a_slow_viewer_drops_frames_while_the_loop_and_the_stream_keep_going(triton, tmp_path):
    """Rounds of 150 steps with no viewer and with one that never reads (once its socket is full), alternated: the
    slow viewer's frames are dropped and counted, the view acks the log's end after every round, and the step
    round trip's median with the slow viewer is measured against the one without (the median of the rounds' ratios;
    the bound is below)."""
    rounds, per_round = 8, 150

    async def main():
        async with running_gateway(triton.url, policy="tiny", experience_dir=tmp_path / "experience") as gw, \
                view_process(gw.address, tmp_path / "view.log") as info, \
                robots(gw.address, "arm_1") as (robot,):
            async def steps(phase: str) -> None:
                robot.phase = phase
                target = robot.steps + per_round
                await until(lambda: robot.steps >= target, f"{per_round} steps ({phase})", timeout=60)
                robot.phase = "between"
                end = gw.experience.durable_offset
                await until(lambda: _acked(info, end), f"the view acking through {end}", timeout=30)

            async def slow(phase: str) -> None:
                async with slow_viewer(info["url"], ready=lambda ch: "/arm_1/camera/top" in ch):
                    robot.phase = "filling"  # until its socket's buffers are full, a slow viewer is a fast one
                    await until(lambda: _dropping(info), "the slow viewer's frames dropped", timeout=60)
                    await steps(phase)

            for i in range(rounds):  # ABBA: a drift of the machine's load weighs on both alike
                for kind in (("none", "slow") if i % 2 == 0 else ("slow", "none")):
                    await (steps(f"none{i}") if kind == "none" else slow(f"slow{i}"))
            s = await stats(info)
            assert s["dropped"] > 100 and s["viewers_total"] == rounds, s
            assert s["received"] >= rounds * per_round * 2 and s["reconnects"] == 0, s
            med = {phase: statistics.median(rtts) for phase, rtts in robot.rtts.items()}
            ratios = [med[f"slow{i}"] / med[f"none{i}"] for i in range(rounds)]
            ms = {kind: [round(med[f"{kind}{i}"] * 1e3, 3) for i in range(rounds)] for kind in ("none", "slow")}
            print(f"round trip medians per round (ms), no viewer: {ms['none']}, a slow viewer: {ms['slow']}; "
                  f"median ratio "
                  f"{statistics.median(ratios):.3f}; dropped {s['dropped']}")
            # The bound is 10%: measured here (printed), asserted loosely. On a shared 2-core machine an A/A run
            # (no viewer in both phases) gives per-round ratios of 0.67..1.11 and medians of 8 rounds up to +-15%, so
            # 1.10 would flake under the suite's load; benchmarks/ measures it on a quiet machine. What this catches:
            # a view that holds the loop back (a stalled stream, a blocking send) costs far more than 50%.
            assert statistics.median(ratios) <= 1.5, ratios

    run(main(), timeout=280)


async def _dropping(info: dict) -> bool:
    viewers = (await stats(info))["viewers"]
    return bool(viewers) and viewers[0]["subscriptions"] > 0 and viewers[0]["dropped"] > 0
