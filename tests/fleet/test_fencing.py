"""A gateway cut off without a TCP reset, and fenced: real gateway processes on one shared registry (PostgreSQL,
started by the test; a SQLite file where PostgreSQL is not installed).

gw-0 sits behind a TCP proxy that can blackhole it (tests/fleet/blackhole.py: connections stay open, nothing
is forwarded, what arrives is held). 8 sessions (`bridge.client.Session`, given [proxy, gw-1]) run on gw-0;
the proxy is blackholed at an instant when every session is between two steps (so each one's next observation
is held, none half-delivered): no reply comes, the client's reply deadline (1 s) sees it, and every session
moves to gw-1, which claims it (epoch 2). Then the proxy heals: gw-0 gets the held observations, completes the
transitions they finish and writes them to its log, late, under epoch 1; its log asks ownership before
acknowledging (one query per group commit), finds epoch 1 stale, acknowledges none of them, and ends the
sessions (fenced). The merged logs keep gw-1's records for every step gw-1 took over: each acknowledged step
once, none of gw-0's late writes.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from tests.fleet.blackhole import Blackhole
from tests.fleet.clients import READY, Gate, Record, sim_session
from tests.fleet.support import Gateways, check_merged, p50_p99_ms
from tests.support.waiting import until
from tether.cluster.postgres import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.slow

SESSIONS = 8
REPLY_TIMEOUT_S = 1.0


@pytest.fixture
def registry(tmp_path):
    """The gateways' shared registry (and session ownership): PostgreSQL, else a SQLite file."""
    if postgres_bin_dir() is None:
        yield str(tmp_path / "registry.sqlite")
        return
    with PostgresServer(tmp_path / "pg") as pg:
        yield pg.url


def test_a_blackholed_gateway_loses_its_sessions_and_its_late_writes_are_fenced(triton, tmp_path, registry):
    gateways = Gateways(tmp_path, triton.url, 2, registry).start()
    records = [Record(f"cut-{i}") for i in range(SESSIONS)]
    stop = tmp_path / "stop"
    fenced_lines = re.compile(r"session (cut-\d+): epoch 1 is stale.*\(fenced\)")

    def fenced() -> set[str]:
        return set(fenced_lines.findall(gateways.logs[0].read_text()))

    async def scenario() -> dict:
        proxy = Blackhole(target_port=gateways.ports[0])
        await proxy.start()
        channels: dict = {}
        gate = Gate()
        tasks = [asyncio.create_task(sim_session([proxy.address, gateways.addresses[1]], r, channels, stop, 20.0, i,
                                                 REPLY_TIMEOUT_S, False, gate)) for i, r in enumerate(records)]
        try:
            await until(lambda: all(len(r.answered) >= READY for r in records), "every session on gw-0", timeout=60)
            assert {r.first_gateway for r in records} == {"gw-0"}
            await gate.closed_on(SESSIONS)  # every session between two steps: its next observation is held
            cut_at = time.time()
            proxy.block()
            gate.open()
            await until(lambda: all(r.moves and r.after_move >= READY for r in records),
                        "every session moved to gw-1 and stepped there", timeout=60)
            held, healed_at = proxy.held_bytes, time.time()
            delivered = await proxy.unblock(gap_s=0.1)  # TCP retransmits once the partition heals
            await until(lambda: len(fenced()) == SESSIONS, "gw-0 fencing every session's late writes")
            fenced_after_s = time.time() - healed_at
            stop.touch()
            await asyncio.gather(*tasks)
        finally:
            stop.touch()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for channel in channels.values():
                await channel.close()
            await proxy.close()
        return {"cut_at": cut_at, "held_bytes": held, "delivered_chunks": delivered, "fenced_after_s": fenced_after_s}

    try:
        outcome = asyncio.run(scenario())
    finally:
        gateways.stop()
    sessions = []
    for r in records:
        d = r.as_dict()
        d["versions"] = {str(k): v for k, v in d["versions"].items()}
        sessions.append(d)
    detect = [r.failovers[0]["broken_at"] - outcome["cut_at"] for r in records]
    resume = [r.failovers[0]["broken_at"] + r.failovers[0]["seconds"] - outcome["cut_at"] for r in records]
    assert all(f["gateway"] == "gw-1" and f["epoch"] == 2 for r in records for f in r.failovers[:1])
    # gw-0's log: per session, what it wrote under epoch 1 at or after the step gw-1 took the session over at
    late = {}
    moved_at = {r.id: r.failovers[0]["durable_through"] for r in records}
    for t in gateways.raw(0):
        assert t.owner_epoch == 1, (t.session, t.step, t.owner_epoch)
        if t.step >= moved_at[t.session]:
            late.setdefault(t.session, []).append(t.step)
    merged = gateways.merged()
    stats = check_merged(merged, sessions, live_version=1)
    for t in merged.transitions:  # none of gw-0's records past the takeover survives the merge
        assert t.owner_epoch == 2 or t.step < moved_at[t.session], (t.session, t.step, t.owner_epoch)
    figures = {"registry": registry.split("://")[0] if "://" in registry else "sqlite",
               "detect_after_cut": p50_p99_ms(detect), "resumed_after_cut": p50_p99_ms(resume),
               "gw0_records_past_takeover": sum(map(len, late.values())), "fenced_sessions": len(fenced()),
               **{k: v for k, v in outcome.items() if k != "cut_at"}, **stats}
    print("blackholed gateway:", json.dumps(figures))
    assert len(fenced()) == SESSIONS
    assert min(detect) >= REPLY_TIMEOUT_S * 0.9 and max(resume) < REPLY_TIMEOUT_S + 5.0, figures
    assert stats["stale"] >= SESSIONS, "gw-0's late writes (one per session at least) are dropped by the merge"
