"""sim.client against the real gateway and a real tritonserver: MuJoCo Hopper sessions end to end.

(tests/sim/test_client.py drives the client against a protocol peer that injects faults the real
gateway never makes: silence, malformed actions.)"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from sim.client import run_sessions
from sim.mujoco import make_env
from tests.gateway.helpers import running_gateway, until

ROOT = Path(__file__).resolve().parents[2]


def test_hopper_sessions_through_the_real_gateway(triton):
    # the session-wide Triton serves "tiny": 11 float32 in, 3 float32 in [-1, 1] out, Hopper-v5's shapes
    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            stats = await run_sessions(gw.address, lambda i: make_env("Hopper-v5", seed=i), envs=3, steps=600)
            await until(lambda: len(gw.closed_stats) == 3 and not gw.sessions, "the gateway closed the 3 streams")
            return stats, list(gw.closed_stats), gw.batcher.stats

    stats, closed, batches = asyncio.run(scenario())
    assert stats.sessions == 3 and stats.steps == 600 and not stats.errors
    assert stats.policy_versions == {1: 600}
    assert stats.episodes >= 3  # an untrained Hopper falls within tens of steps
    # the gateway saw the same loop: one action per env step, one EpisodeEnd per episode
    assert sum(s.steps for s in closed) == 600 and sum(s.episodes for s in closed) == stats.episodes
    assert batches.requests == 600


def test_tether_sim_given_several_gateways_skips_a_dead_first_one(triton, unused_port):
    # --gateway A,B: A refuses connections (nothing listens on it), so the sessions open on B
    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tether", "sim", "--gateway", f"127.0.0.1:{unused_port},{gw.address}",
                "--env", "Hopper-v5", "--envs", "2", "--steps", "100", "--connect-timeout", "6",
                cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
            return proc.returncode, json.loads(out), err.decode(), [s.steps for s in gw.closed_stats]

    code, summary, err, closed = asyncio.run(scenario())
    assert code == 0, err
    assert summary["steps"] == 100 and not summary["errors"], summary
    assert sum(closed) == 100          # every step went to the live gateway
