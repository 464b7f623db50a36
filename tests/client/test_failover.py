"""The client's failover: two real `tether gateway` processes, each with its own experience log; the
session is given both addresses, the first is killed with kill -9 mid-run, and the session resumes on
the second with Replay. Read back with `bridge.experience.read_transitions`: no step lost; the only
steps both logs hold are ones the first gateway had not yet acknowledged durable when it died."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import pytest

from bridge.client import Session
from bridge.experience import read_transitions
from sim.client import run_sessions
from sim.mujoco import make_env
from tests.support.gateways import start_gateways
from tests.support.waiting import until

pytestmark = pytest.mark.slow

STEPS = 400


def _logged(log_dir) -> tuple[Counter[int], dict[int, bool]]:
    steps: Counter[int] = Counter()
    ended: dict[int, bool] = {}
    for t in read_transitions(log_dir):
        steps[t.step] += 1
        ended[t.step] = t.terminated or t.truncated
    return steps, ended


def test_kill_9_first_gateway_session_resumes_on_second_with_replay(triton, tmp_path):
    gateways = start_gateways(triton.url, tmp_path)
    addresses = [gw.address for gw in gateways]
    sessions: list[Session] = []

    async def kill_first_mid_run() -> int:
        """kill -9 the first gateway once it has made 100 steps durable; the durable_through the session held."""
        await until(lambda: sessions and sessions[0].durable_through >= 100, "the first gateway logging 100 steps",
                    timeout=120)
        os.kill(gateways[0].pid, signal.SIGKILL)
        return sessions[0].durable_through

    async def scenario():
        killer = asyncio.create_task(kill_first_mid_run())
        stats = await run_sessions(addresses, lambda i: make_env("Hopper-v5", seed=i, max_episode_steps=10_000),
                                   envs=1, steps=STEPS, reconnect_s=30.0, sessions_out=sessions)
        return stats, await killer

    try:
        stats, at_kill = asyncio.run(scenario())
    finally:
        for gateway in gateways:
            gateway.stop()
    [session] = sessions
    assert gateways[0].proc.returncode == -signal.SIGKILL
    assert session.reconnects == 1 and session.address == addresses[1]
    [move] = session.failovers
    assert (move.source, move.target) == (addresses[0], addresses[1])
    # acknowledgements already on the wire when the gateway died still reach the client: what it held at the break
    acknowledged = move.durable_through
    assert acknowledged >= at_kill, (acknowledged, at_kill)
    assert move.replayed and move.replayed[0] == acknowledged, "the replay starts at the first unacknowledged step"
    assert not stats.errors, stats.errors

    a, a_ended = _logged(tmp_path / "experience-0")
    b, b_ended = _logged(tmp_path / "experience-1")
    assert a and b, "both gateways logged part of the run"
    assert max(a.values()) == 1 and max(b.values()) == 1, "neither log holds a step twice"
    union = sorted(set(a) | set(b))
    ended = {**a_ended, **b_ended}
    assert union[0] == 0
    for x, y in zip(union, union[1:], strict=False):
        # the next logged step follows at once, or after the LAST observation that ended an episode
        assert y == x + (2 if ended[x] else 1), f"step {x} -> {y}: a step was lost"
    assert len(union) == stats.steps, "every step the policy answered is logged"
    both = set(a) & set(b)
    assert all(acknowledged <= s for s in both), (
        f"steps {sorted(both)} in both logs; the first gateway had acknowledged up to {acknowledged}")
    assert {s for s in union if s < acknowledged} <= set(a), "everything acknowledged durable is in the first log"
    assert set(b) >= {s for s in union if s >= move.replayed[-1]}, "the second gateway logged the rest"
    print(f"acknowledged through {acknowledged}; replayed {len(move.replayed)}; in both logs: {sorted(both)}")
