"""Rewards computed by the gateway from a YAML config: logged with every term and the config's
version; a success condition ends the episode; a bad config stops the gateway at start-up."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import numpy as np

from bridge.experience import read_transitions
from bridge.rewards import RewardFunction
from protos import bridge_pb2
from protos.codec import decode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import running_gateway
from tests.support.waiting import until

CONFIG = """
reward:
  terms:
    - {type: env_reward}
    - {type: action_magnitude, action: action, weight: -0.5}
    - {type: success, observation: observation, indices: [0], below: 0.5, bonus: 5.0, terminate: true}
"""


def test_rewards_are_computed_logged_and_end_the_episode(triton, tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(CONFIG)
    far, near = np.full(11, 2.0, np.float32), np.full(11, 0.1, np.float32)

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", experience_dir=tmp_path / "log",
                                   rewards={"tiny": config}) as gw:
            async with RawSession(gw.address, hello("rw", obs=OBS, act=ACT)) as s:
                assert s.welcome.reward_version == RewardFunction.from_yaml(config).version
                first = await s.step(far, step_type=bridge_pb2.FIRST)
                second = await s.step(far, reward=1.0)      # not there yet: an action
                end = await s.step(near, reward=2.0)        # success: the gateway ends the episode
                assert second.WhichOneof("kind") == "action"
                assert end.WhichOneof("kind") == "episode_end" and end.episode_end.reason == "reward:success"
                a0, a1 = (decode(r.action.tensors[0]).astype(np.float64) for r in (first, second))
                r0, r1 = 1.0 - 0.5 * (a0 ** 2).sum(), 2.0 - 0.5 * (a1 ** 2).sum() + 5.0
                assert abs(end.episode_end.episode_return - (r0 + r1)) < 1e-5
                again = await s.step(far, step_type=bridge_pb2.FIRST)   # the client starts a new episode
                assert again.WhichOneof("kind") == "action"
            await until(lambda: not gw.sessions, "the gateway closed the stream")  # its last transition logged
        return a0, a1

    a0, a1 = asyncio.run(scenario())
    logged = list(read_transitions(tmp_path / "log"))
    assert [t.step for t in logged] == [0, 1]
    t0, t1 = logged
    assert t0.reward_terms["action_magnitude"] == -0.5 * float((a0 ** 2).sum())
    assert t1.reward_terms["success"] == 5.0 and t1.terminated and not t1.truncated and t1.next_observation
    assert t0.reward_version == t1.reward_version == RewardFunction.from_yaml(tmp_path / "tiny.yaml").version
    assert abs(t1.reward - sum(t1.reward_terms.values())) < 1e-9 and t1.env_reward == 2.0


def test_a_bad_reward_config_stops_the_gateway_naming_the_term(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("reward:\n  terms:\n    - {type: env_reward}\n    - {type: action_magnitude, action: action}\n")
    run = subprocess.run([sys.executable, "-m", "tether", "gateway", "--triton", "127.0.0.1:1", "--policy", "tiny",
                          "--rewards", f"tiny={bad}"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "reward term 1 (action_magnitude)" in run.stderr and "weight" in run.stderr, run.stderr
