"""Experience on NATS JetStream with real `nats-server` processes (three, routed, JetStream R3): a gateway
logs to the stream while sessions step; the stream's leader is killed (SIGKILL). No transition a client
was told is durable is lost or doubled (the archive, written by `tether archive`'s Archiver into MCAP
segments, holds every step below each client's `durable_through` exactly once, and `tether log` reads
it); `durable_through` stalls for the stream's leader election only (the longest stall is printed); the
clients' replay buffers stay bounded by what they sent during the stall."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bridge.client import Session
from bridge.experience import read_transitions
from bridge.experience.archive import Archiver
from bridge.experience.jetstream import STREAM, connect
from bridge.experience.jetstream_log import JetStreamLog
from bridge.experience.log import ExperienceLog
from bridge.experience.tee import TeeLog
from protos import bridge_pb2, experience_pb2
from protos.codec import encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import hello
from tests.support.gateways import running_gateway
from tests.support.waiting import until, wait_until
from tether.cluster.nats import NatsCluster, nats_server_binary

pytestmark = pytest.mark.skipif(nats_server_binary() is None,
                                reason="nats-server not installed (apt-get install nats-server)")

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = 6
HZ = 50.0
ELECTION_BOUND_S = 12.0  # nats-server 2.9: followers campaign 4-9 s after a dead leader's heartbeat; + backoff


class Stepper:
    """One session stepping at HZ; records when its durable_through moved and its replay buffer's size."""

    def __init__(self, address: str, session_id: str):
        self.session = Session(address, hello(session_id, obs=OBS, act=ACT), reply_timeout_s=30.0)
        self.sent = 0
        self.advanced: list[tuple[float, int]] = []   # (time, durable_through) at each advance
        self.max_unacked = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        rng = np.random.default_rng(len(self.session.id))
        async with self.session as s:
            assert s.welcome.logging
            while not self.stop.is_set():
                step = self.sent
                kind = bridge_pb2.FIRST if step % 50 == 0 else bridge_pb2.LAST if step % 50 == 49 else bridge_pb2.MID
                x = rng.standard_normal(11).astype(np.float32)
                obs = bridge_pb2.Observation(step=step, step_type=kind, episode=step // 50, reward=1.0,
                                             t_sent_ns=time.time_ns(), tensors=[encode("observation", x)])
                reply = await s.step(obs)
                assert reply.WhichOneof("kind") in ("action", "episode_end"), reply
                self.sent += 1
                if not self.advanced or s.durable_through > self.advanced[-1][1]:
                    self.advanced.append((time.monotonic(), s.durable_through))
                self.max_unacked = max(self.max_unacked, len(s.unacked))
                await asyncio.sleep(1 / HZ)

    def longest_stall(self, since: float) -> float:
        """The longest time durable_through did not move, from `since` on."""
        times = [t for t, _ in self.advanced if t >= since]
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)


async def _stream_leader(cluster: NatsCluster) -> int:
    nc = await connect(cluster.urls, name="test")
    try:
        info = await nc.jetstream().stream_info(STREAM)
        return cluster.index(info.cluster.leader)
    finally:
        await nc.close()


def test_stream_leader_killed_no_acknowledged_transition_lost(triton, tmp_path):
    with NatsCluster(tmp_path / "nats", servers=3) as cluster:
        asyncio.run(_leader_killed(triton, cluster, tmp_path))


async def _leader_killed(triton, cluster: NatsCluster, tmp_path: Path) -> None:
    async with running_gateway(triton.url, policy=triton.policy, experience_url=cluster.url) as gateway:
        stream_log = gateway.experience
        assert stream_log.replicas == 3
        steppers = [Stepper(gateway.address, f"robot-{i}") for i in range(SESSIONS)]
        tasks = [asyncio.create_task(s.run()) for s in steppers]
        try:
            await until(lambda: all(s.session.durable_through >= 20 for s in steppers), "20 durable steps each",
                        timeout=60, period=0.05)
            leader = await _stream_leader(cluster)
            at_kill = {s.session.id: s.sent for s in steppers}
            cluster.kill(leader)
            killed = time.monotonic()
            # every session's durable_through passes what it had sent at the kill, and its replay buffer drains
            await until(lambda: all(s.session.durable_through >= at_kill[s.session.id] + 20
                                    and len(s.session.unacked) <= 10 for s in steppers),
                        "durable_through past the kill, replay buffers drained", timeout=60, period=0.05)
            recovered = time.monotonic() - killed
        finally:
            for s in steppers:
                s.stop.set()
            await asyncio.gather(*tasks)
        assert await stream_log.wait_durable(30), stream_log.stats
        stats = stream_log.stats
    stall = max(s.longest_stall(killed - 1.0) for s in steppers)
    told = {s.session.id: s.session.durable_through for s in steppers}
    sent = {s.session.id: s.sent for s in steppers}
    print(f"\nNATS stream leader n{leader} killed: durable_through stalled {stall:.2f} s at most "
          f"({recovered:.2f} s until every session's replay buffer drained); replay buffers max "
          f"{max(s.max_unacked for s in steppers)} steps at {HZ:g} Hz; publisher: retries {stats.retries}, "
          f"longest stall {stats.longest_stall_s:.2f} s, max pending {stats.max_pending}, "
          f"stream duplicates {stats.stream_duplicates}")
    assert stats.refused == 0 and stats.fenced == 0 and stats.pending == 0, stats
    assert stall <= ELECTION_BOUND_S, f"durable_through stalled {stall:.2f} s"
    for s in steppers:  # bounded: what a session sent during the stall (plus the reply lag), never more
        assert s.max_unacked <= HZ * (stall + 2.0), (s.session.id, s.max_unacked, stall)
        assert len(s.session.unacked) <= 20, (s.session.id, len(s.session.unacked))  # drained (a reply's lag)

    archive = tmp_path / "archive"
    archiver = Archiver(cluster.url, archive)
    written = await archiver.run(until_caught_up=True)
    steps: dict[str, Counter] = {}
    for t in read_transitions(archive):
        steps.setdefault(t.session, Counter())[t.step] += 1
    assert written == sum(sum(c.values()) for c in steps.values())
    for session, through in told.items():
        counts = steps.get(session, Counter())
        doubled = [k for k, n in counts.items() if n != 1]
        missing = [k for k in range(through) if counts[k] != 1 and k % 50 != 49]  # a LAST step: no action, no row
        assert not doubled and not missing, (session, through, missing[:10], doubled[:10])
        assert max(counts) < sent[session], (session, max(counts), sent[session])

    # `tether log` reads the archive as it reads a gateway's log
    out = subprocess.run([sys.executable, "-m", "tether", "log", "inspect", str(archive), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    summary = json.loads(out.stdout)
    assert summary["transitions"] == written and summary["sessions"] == SESSIONS, summary

    # a second run resumes from its durable consumer: nothing new, nothing written twice
    again = Archiver(cluster.url, archive)
    assert await again.run(until_caught_up=True) == 0
    assert again.next_offset == archiver.next_offset


def _transition(session: str, step: int) -> experience_pb2.Transition:
    return experience_pb2.Transition(session=session, step=step, policy="tiny",
                                     observation=[encode("observation", np.full(11, step, np.float32))],
                                     action=[encode("action", np.zeros(3, np.float32))])


def test_tee_msg_id_dedup_and_last_step_from_the_stream(tmp_path):
    """Beside a local log (TeeLog): durable where both are. A gateway that never saw a session learns its last
    step from the stream (`prepare`, on Hello); a message sent again under the same msg id is not stored twice."""
    with NatsCluster(tmp_path / "nats", servers=1) as cluster:
        asyncio.run(_tee_and_dedup(cluster.url, tmp_path))


async def _tee_and_dedup(url: str, tmp_path: Path) -> None:
    local, stream = ExperienceLog(tmp_path / "log"), JetStreamLog(url)
    await local.start()
    await stream.start()
    tee = TeeLog(local, stream)
    await asyncio.gather(*(tee.append(_transition("s", i)) for i in range(50)))
    assert tee.durable_step("s") == 49 and tee.append(_transition("s", 10)) is None
    await tee.close()
    assert [t.step for t in read_transitions(tmp_path / "log")] == list(range(50))

    other = JetStreamLog(url)  # another gateway: the session moved there
    await other.start()
    try:
        assert other.last_step("s") is None
        await other.prepare(["s", "never-seen"])
        assert (other.last_step("s"), other.durable_step("s"), other.last_step("never-seen")) == (49, 49, None)
    finally:
        await other.close()
    again = JetStreamLog(url)  # one that does not ask: its retry of step 40 is dropped by the stream (msg id)
    await again.start()
    try:
        await again.append(_transition("s", 40))
        assert again.stats.stream_duplicates == 1
        info = await again._js.stream_info(STREAM)
        assert info.state.messages == 50
    finally:
        await again.close()


def test_archiver_killed_and_restarted_archives_every_message_once(tmp_path):
    """`tether archive` SIGKILLed mid-run (a segment left open, messages delivered and not acknowledged), then
    run again until caught up: the archive holds every stream message once, offsets 0..N-1."""
    total = 3000
    with NatsCluster(tmp_path / "nats", servers=1) as cluster:
        asyncio.run(_publish(cluster.url, total))
        archive = tmp_path / "archive"
        cmd = [sys.executable, "-m", "tether", "archive", "--experience", cluster.url, "--out", str(archive),
               "--batch", "50"]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            def archived() -> int:
                return sum(1 for _ in read_transitions(archive)) if archive.is_dir() else 0

            wait_until(lambda: proc.poll() is not None or archived() >= 500, "500 transitions archived", timeout=60,
                       period=0.05)
            assert proc.poll() is None, "the archiver did not get going"
        finally:
            proc.kill()
            proc.wait()
        again = subprocess.run([*cmd, "--until-caught-up"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                               check=True)
        summary = json.loads(again.stdout.strip().splitlines()[-1])
    offsets = [t.offset for t in read_transitions(archive)]
    assert offsets == list(range(total)), (len(offsets), summary)
    assert summary["next_offset"] == total and 0 < summary["archived"] <= total - 500, summary  # the rest only


async def _publish(url: str, total: int) -> None:
    async with JetStreamLog(url) as log:
        await asyncio.gather(*(log.append(_transition(f"s{i % 4}", i // 4)) for i in range(total)))
