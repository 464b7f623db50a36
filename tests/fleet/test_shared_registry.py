"""Two gateway processes on one PostgreSQL registry (issue 16, part 1), with one Triton and one model repository
(the session's): a promote on gateway A is served by gateway B within the follow latency (recorded; the target is
100 ms); 100 racing promotes on A and B leave exactly one live version at every sampled instant and every action's
version was live when it was served; PostgreSQL restarted mid-run costs no step, changes are refused (UNAVAILABLE)
while it is down and B catches up within 2 s after; the advisory leader lock passes to the other gateway when its
holder is killed with SIGKILL.

Every version is pinned to a label no session carries, so all of them stay loaded: a promote moves the registry
and the routing only (what is measured is the registry's propagation, not Triton's loading). Measurements are
printed and written to <tmp>/shared_registry.json."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import threading
import time

import grpc
import numpy as np
import psycopg
import pytest

from bridge.registry import Registry, State
from bridge.registry.follow import LEADER_LOCK_KEY
from protos import bridge_pb2, fleet_pb2, fleet_pb2_grpc, policies_pb2, policies_pb2_grpc
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import gateway_process
from tests.support.waiting import until, wait_until
from tether.cluster.postgres import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL's initdb is not installed "
                                "(/usr/lib/postgresql/*/bin/initdb; Debian package postgresql)")

POLICY = "shared"
VERSIONS = 6
FOLLOW_BOUND_S = 2.0     # a clear regression only: the target is 100 ms, the measured median is printed
CATCH_UP_BOUND_S = 2.0   # after PostgreSQL is back
FAILOVER_BOUND_S = 10.0


@pytest.fixture(scope="module")
def cluster(triton, tmp_path_factory):
    """PostgreSQL, v1..v6 of `shared` in the session's Triton, the registry (v6 live, every version pinned to a label
    nobody has) and two gateways A and B on it; `figures` gathers what the tests measure."""
    root = tmp_path_factory.mktemp("shared_registry")
    figures: dict = {}
    with PostgresServer(root / "pg") as pg:
        triton.add_policy(POLICY, versions=VERSIONS, seed=1, serve="onnx")
        with Registry(pg.url) as registry:
            for version in range(1, VERSIONS + 1):  # each enters live, the one before retires
                registry.add(POLICY, version, sha256=f"{version:064x}", format="onnx", lineage={}, inputs=[],
                             outputs=[], who="test", why="setup", state=State.LIVE)
            for version in range(1, VERSIONS + 1):
                registry.pin(POLICY, f"keep=v{version}", version, who="test", why="keep every version loaded")
        gateways = {}
        try:
            for name in ("a", "b"):
                gateways[name] = gateway_process(
                    triton.url, root / f"gateway-{name}.log", "--registry", pg.url, "--model-repository",
                    triton.repo.root, "--switch", "step", "--gateway-id", f"gw-{name}", "--deadline-ms", "5000",
                    policy=POLICY, timeout=90)
                gateways[name].start()
            yield {"pg": pg, "root": root, "figures": figures, **gateways}
        finally:
            for gw in gateways.values():
                gw.stop()
            (root / "shared_registry.json").write_text(json.dumps(figures, indent=2))
            print(f"\nshared registry figures ({root / 'shared_registry.json'}): {json.dumps(figures)}")


class Stepper:
    """One session stepping as fast as its gateway answers; every reply recorded as (received ns, version) and
    every non-action reply kept as an error."""

    def __init__(self, address: str, session_id: str, labels: dict[str, str] | None = None):
        self.address, self.session_id, self.labels = address, session_id, labels or {}
        self.actions: list[tuple[int, int]] = []
        self.held: list[int] = []  # received ns of the steps an e-stop held
        self.errors: list[str] = []
        self._stop = False

    async def run(self) -> None:
        obs = np.random.default_rng(0).standard_normal(11).astype(np.float32)
        h = hello(self.session_id, obs=OBS, act=ACT, policy=POLICY)
        h.labels.update(self.labels)
        async with RawSession(self.address, h) as s:
            first = True
            while not self._stop:
                reply = await s.step(obs, step_type=bridge_pb2.FIRST if first else bridge_pb2.MID)
                first = False
                if reply.WhichOneof("kind") != "action":
                    self.errors.append(str(reply)[:300])
                    return
                self.actions.append((time.time_ns(), reply.action.policy_version))
                if reply.action.estop:
                    self.held.append(self.actions[-1][0])

    def stop(self) -> None:
        self._stop = True

    def seen_after(self, version: int, t_ns: int) -> int | None:
        return next((t for t, v in self.actions if v == version and t >= t_ns), None)


@contextlib.asynccontextmanager
async def stepping(*steppers: Stepper):
    tasks = [asyncio.create_task(s.run()) for s in steppers]
    await until(lambda: all(s.actions or s.errors for s in steppers), "every session's first action")
    try:
        yield steppers
    finally:
        for s in steppers:
            s.stop()
        await asyncio.gather(*tasks)
    for s in steppers:
        assert s.errors == [], f"{s.session_id} on {s.address}: {s.errors[:3]}"


def stub(address: str):
    channel = grpc.aio.insecure_channel(address)
    return channel, policies_pb2_grpc.PoliciesStub(channel)


def promote(policies, version: int, why: str = "test"):
    return policies.Promote(policies_pb2.PromoteRequest(policy=POLICY, version=version, to="live", why=why),
                            timeout=30)


def live_now(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT version FROM versions WHERE policy = %s AND state = 'live'",
                            (POLICY,)).fetchone()[0]


def live_entries(url: str) -> list[tuple[int, int]]:
    """(t_ns, version) of every move to live, in commit order."""
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT t_ns, version FROM events WHERE policy = %s AND kind = 'state' AND "
                            "to_state = 'live' ORDER BY id", (POLICY,)).fetchall()


def another(url: str) -> int:
    current = live_now(url)
    return VERSIONS if current != VERSIONS else VERSIONS - 1


def test_a_promote_on_a_is_served_by_b(cluster):
    async def main():
        a_ch, a = stub(cluster["a"].address)
        async with stepping(Stepper(cluster["b"].address, "latency-b")) as (on_b,):
            latencies = []
            for _ in range(10):
                version = another(cluster["pg"].url)
                await promote(a, version)
                committed = live_entries(cluster["pg"].url)[-1]
                assert committed[1] == version
                await until(lambda v=version, t=committed[0]: on_b.seen_after(v, t) is not None,
                            f"gateway B serving v{version}", timeout=10)
                latencies.append((on_b.seen_after(version, committed[0]) - committed[0]) / 1e9)
        await a_ch.close()
        return latencies

    latencies = asyncio.run(main())
    median = statistics.median(latencies)
    cluster["figures"]["promote_on_a_served_by_b_s"] = {"median": median, "max": max(latencies),
                                                        "all": latencies}
    print(f"\npromote on A -> B serves it: median {median * 1e3:.1f} ms, max {max(latencies) * 1e3:.1f} ms "
          f"(target 100 ms)")
    assert max(latencies) < FOLLOW_BOUND_S


def test_racing_promotes_leave_one_live_version(cluster):
    url = cluster["pg"].url
    samples: list[int] = []
    sampling = threading.Event()

    def sample() -> None:  # how many live versions, in one statement each, as fast as it goes
        with psycopg.connect(url, autocommit=True) as conn:
            while not sampling.is_set():
                samples.append(conn.execute("SELECT count(*) FROM versions WHERE policy = %s AND state = 'live'",
                                            (POLICY,)).fetchone()[0])

    async def main():
        (a_ch, a), (b_ch, b) = stub(cluster["a"].address), stub(cluster["b"].address)
        outcomes: list[str] = []

        async def stream(policies, versions):
            for version in versions:
                try:
                    await promote(policies, version, why="race")
                    outcomes.append("ok")
                except grpc.aio.AioRpcError as exc:  # promoting the live version again is refused, nothing else
                    outcomes.append(exc.code().name if exc.code() != grpc.StatusCode.FAILED_PRECONDITION or
                                    "may not move to live" not in exc.details() else "refused")

        steppers = [Stepper(cluster[g].address, f"race-{g}{i}") for g in ("a", "b") for i in range(2)]
        async with stepping(*steppers):
            started = time.time_ns()
            await asyncio.gather(stream(a, [1 + (i * 2) % VERSIONS for i in range(50)]),
                                 stream(b, [2 + (i * 2 + 3) % (VERSIONS - 1) for i in range(50)]))
            final = live_now(url)
            await until(lambda: all(s.actions[-1][1] == final for s in steppers), f"every session on v{final}",
                        timeout=FOLLOW_BOUND_S + 5)
        await a_ch.close()
        await b_ch.close()
        return outcomes, steppers, started

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        outcomes, steppers, started = asyncio.run(main())
    finally:
        sampling.set()
        sampler.join()
    assert len(outcomes) == 100 and set(outcomes) <= {"ok", "refused"}, outcomes
    assert samples and set(samples) == {1}, f"live versions sampled: {sorted(set(samples))}"
    with psycopg.connect(url) as conn:  # the database itself refuses a second live version
        assert conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'one_live'").fetchone()[0].endswith(
            "WHERE (state = 'live'::text)")
    entries = live_entries(url)
    moves = [(t, v) for t, v in entries if t >= started]
    assert len(moves) == outcomes.count("ok")
    # every action's version was live at some instant within the follow bound before it was received
    late = []
    for s in steppers:
        for t, version in s.actions:
            if t < started:
                continue
            live_at = [v for (t0, v), (t1, _) in zip(entries, [*entries[1:], (2**63, None)], strict=True)
                       if t0 <= t and t1 >= t - FOLLOW_BOUND_S * 1e9]
            if version not in live_at:
                late.append((s.session_id, t, version, live_at))
    assert late == [], late[:5]
    actions = sum(len(s.actions) for s in steppers)
    cluster["figures"]["racing_promotes"] = {"promotes": 100, "committed": outcomes.count("ok"),
                                             "refused": outcomes.count("refused"), "live_samples": len(samples),
                                             "actions_checked": actions}
    print(f"\n100 racing promotes: {outcomes.count('ok')} committed, {outcomes.count('refused')} refused (already "
          f"live); {len(samples)} samples of the live count, all 1; {actions} actions checked")


def test_postgres_restarted_mid_run(cluster):
    pg, url = cluster["pg"], cluster["pg"].url

    async def main():
        (a_ch, a), (b_ch, b) = stub(cluster["a"].address), stub(cluster["b"].address)
        steppers = [Stepper(cluster["a"].address, "restart-a"), Stepper(cluster["b"].address, "restart-b")]
        async with stepping(*steppers):
            target = another(url)
            await asyncio.to_thread(pg.stop)
            counts = [len(s.actions) for s in steppers]
            for policies in (a, b):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await promote(policies, target, why="while down")
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
                assert "registry unreachable" in info.value.details()
            await until(lambda: all(len(s.actions) > c + 50 for s, c in zip(steppers, counts, strict=True)),
                        "sessions stepping while PostgreSQL is down")
            await asyncio.to_thread(pg.start)
            back = time.time_ns()
            while True:  # the first promote after the restart: A's registry reconnects on that call
                try:
                    await promote(a, target, why="back")
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                    await asyncio.sleep(0.05)
            promoted = time.time_ns()
            await until(lambda: steppers[1].seen_after(target, back) is not None, f"B serving v{target}",
                        timeout=10)
            caught_up = (steppers[1].seen_after(target, back) - back) / 1e9
        await a_ch.close()
        await b_ch.close()
        return caught_up, (promoted - back) / 1e9

    caught_up, promote_after = asyncio.run(main())
    cluster["figures"]["postgres_restart"] = {"b_caught_up_after_restart_s": caught_up,
                                              "first_promote_after_restart_s": promote_after}
    print(f"\nPostgreSQL restarted: first promote {promote_after * 1e3:.0f} ms after it was back, B served it "
          f"{caught_up * 1e3:.0f} ms after it was back")
    assert caught_up < CATCH_UP_BOUND_S


def test_an_estop_on_a_holds_a_session_on_b(cluster):
    """E-stops are shared state too: latched through A, B holds its robot's session; released through B, A's
    cache lets go as well (each gateway re-reads the standing e-stops when the epoch moves)."""

    async def main():
        a_ch, b_ch = grpc.aio.insecure_channel(cluster["a"].address), grpc.aio.insecure_channel(cluster["b"].address)
        on_a, on_b = fleet_pb2_grpc.FleetStub(a_ch), fleet_pb2_grpc.FleetStub(b_ch)
        arm = Stepper(cluster["b"].address, "estop-b", labels={"robot": "arm_9"})
        other = Stepper(cluster["b"].address, "estop-other", labels={"robot": "arm_8"})
        async with stepping(arm, other):
            latched = time.time_ns()
            await on_a.EStop(fleet_pb2.EStopRequest(robot="arm_9", reason="person in the cell"), timeout=30)
            await until(lambda: arm.held and arm.held[-1] > latched, "B holding arm_9", timeout=FOLLOW_BOUND_S)
            held_after = (arm.held[0] - latched) / 1e9
            await on_b.Release(fleet_pb2.EStopRequest(robot="arm_9", reason="clear"), timeout=30)
            released = time.time_ns()
            await until(lambda: arm.actions[-1][0] > released and arm.held[-1] < arm.actions[-1][0],
                        "B acting for arm_9 again", timeout=FOLLOW_BOUND_S)
            assert other.held == []
        await a_ch.close()
        await b_ch.close()
        return held_after

    held_after = asyncio.run(main())
    cluster["figures"]["estop_on_a_held_on_b_s"] = held_after
    print(f"\ne-stop through A: B held the robot's session {held_after * 1e3:.0f} ms later")


def leader_pid(url: str) -> int | None:
    """The process whose connection holds the leader lock (its application_name says tether-leader pid=N)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                           "WHERE l.locktype = 'advisory' AND l.granted AND "
                           "((l.classid::bigint << 32) | l.objid::bigint) = %s", (LEADER_LOCK_KEY,)).fetchone()
    return None if row is None else int(row[0].split("pid=")[1])


def test_the_leader_lock_passes_on_when_its_holder_is_killed(cluster):
    """Last in this file: it kills one of the gateways."""
    url = cluster["pg"].url
    pids = {cluster["a"].pid: "a", cluster["b"].pid: "b"}
    holder = wait_until(lambda: pids.get(leader_pid(url)), "a gateway holding the leader lock", period=0.05)
    survivor = "b" if holder == "a" else "a"
    os.kill(cluster[holder].pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: leader_pid(url) == cluster[survivor].pid, f"the lock passing to {survivor}",
               timeout=FAILOVER_BOUND_S, period=0.01)
    failover = time.monotonic() - killed
    cluster["figures"]["leader_failover_s"] = failover
    print(f"\nleader lock: gateway {holder} killed -> gateway {survivor} leads after {failover * 1e3:.0f} ms")

    async def still_serves():
        _, policies = stub(cluster[survivor].address)
        await promote(policies, another(url), why="after failover")
        async with stepping(Stepper(cluster[survivor].address, "after-failover")):
            pass

    asyncio.run(still_serves())
