"""sim.client against the real gateway and a real tritonserver: MuJoCo Hopper sessions end to end.

(tests/sim/test_client.py drives the client against a protocol peer that injects faults the real
gateway never makes: silence, malformed actions.)"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from sim.cli import main as sim_main
from sim.client import run_sessions
from sim.mujoco import make_env
from tests.support.gateways import running_gateway
from tests.support.waiting import until
from tether.topology import DemoConfig

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


def test_rate_paces_each_session_to_at_most_hz_steps_a_second(triton):
    # --rate 50 for ~1.5 s: a deadline pacer never runs ahead of start + k / 50 per session (an upper
    # bound holds under any load; a slow machine only steps less), and the gateway saw the same steps
    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            stats = await run_sessions(gw.address, lambda i: make_env("Hopper-v5", seed=i), envs=2, seconds=1.5,
                                       rate_hz=50.0)
            await until(lambda: len(gw.closed_stats) == 2 and not gw.sessions, "the gateway closed the 2 streams")
            return stats, [s.steps for s in gw.closed_stats]

    stats, per_session = asyncio.run(scenario())
    assert stats.sessions == 2 and not stats.errors
    assert 0 < stats.steps <= 2 * (50 * stats.elapsed_s + 2), (stats.steps, stats.elapsed_s)
    assert all(0 < n <= 50 * stats.elapsed_s + 2 for n in per_session), (per_session, stats.elapsed_s)


@pytest.mark.parametrize("rate", ["0", "-5", "nan", "inf"])
def test_tether_sim_refuses_a_bad_rate_naming_the_flag(rate, capsys):
    # refused before any gateway is contacted (nothing listens on the address)
    with pytest.raises(SystemExit) as exc:
        sim_main(["--gateway", "127.0.0.1:9", "--rate", rate, "--seconds", "1"])
    assert exc.value.code == 2
    assert "--rate" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--rate"):
        DemoConfig(rate_hz=float(rate))
    with pytest.raises(ValueError, match="--rate"):
        asyncio.run(run_sessions("127.0.0.1:9", lambda i: make_env("Hopper-v5"), envs=1, seconds=1,
                                 rate_hz=float(rate)))
