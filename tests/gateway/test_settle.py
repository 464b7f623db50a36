"""What a reply does not need is done after it (`Session.settle`, from `flush`): the router hears the step then,
and a MID step's reward (no reward term can end the episode) is computed then; returns and the log are as before."""

from __future__ import annotations

import asyncio

import numpy as np

from bridge.experience import ExperienceLog
from bridge.experience.reader import read_transitions
from bridge.gateway.session.batcher import MicroBatcher
from bridge.gateway.session.recorder import Recorder
from bridge.gateway.session.session import Session
from bridge.gateway.versions.catalog import ServedPolicy
from bridge.rewards import RewardFunction
from protos import bridge_pb2
from protos.codec import encode
from tests.gateway.test_batcher import ACT, OBS, SlowDoubler

REWARDS = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # env rewards of steps 0 (FIRST) .. 5 (LAST)


class HeardSteps:
    """A VersionRouter that keeps no opinion on the version and records what it hears."""

    def __init__(self):
        self.steps: list[float] = []
        self.returns: list[float] = []

    def acting(self, policy, session_id, labels):
        return None

    def stepped(self, policy, *, latency_s, error, guard, inputs=None, actions=None, deadline_s=0.0, rows=False,
                interventions=0, env_steps=1):
        assert not error and actions is not None
        self.steps.append(latency_s)

    def episode_ended(self, policy, episode_return):
        self.returns.append(episode_return)


def observation(step: int) -> bridge_pb2.Observation:
    kind = bridge_pb2.FIRST if step == 0 else bridge_pb2.LAST if step == len(REWARDS) - 1 else bridge_pb2.MID
    return bridge_pb2.Observation(step=step, step_type=kind, reward=REWARDS[step],
                                  tensors=[encode("obs", np.full(2, step, np.float32))])


def session(router: HeardSteps, log=None) -> Session:
    rewards = RewardFunction.passthrough()
    assert not rewards.can_terminate  # the case whose MID rewards are settled after the reply
    return Session(session_id="s", source="test", policy=ServedPolicy("m", 1, OBS, ACT), observation_spec=OBS,
                   action_spec=ACT, batcher=MicroBatcher(SlowDoubler(0)), deadline_s=1, rewards=rewards,
                   router=router, recorder=Recorder(session="s", source="test", log=log,
                                                    reward_version=rewards.version))


def test_the_router_hears_a_step_after_its_reply_and_the_log_and_return_are_unchanged(tmp_path):
    router = HeardSteps()

    async def scenario():
        async with ExperienceLog(tmp_path, fsync=False) as log:
            s = session(router, log)
            replies = []
            for step in range(len(REWARDS)):
                replies.append(await s.handle(observation(step)))
                if step < len(REWARDS) - 1:  # the reply is out, the router has not heard the step yet
                    assert replies[-1].WhichOneof("kind") == "action" and len(router.steps) == step
                s.flush()
                assert len(router.steps) == min(step + 1, len(REWARDS) - 1)
            await asyncio.sleep(0)  # the log's acknowledgements
            return replies

    replies = asyncio.run(scenario())
    end = replies[-1].episode_end
    assert end.episode_return == sum(REWARDS[1:]) and end.length == len(REWARDS) - 1
    assert router.returns == [sum(REWARDS[1:])]
    logged = list(read_transitions(tmp_path))
    assert [t.step for t in logged] == [0, 1, 2, 3, 4]
    assert [t.reward for t in logged] == REWARDS[1:]  # step t's reward: what step t+1 brought
    assert [t.truncated for t in logged] == [False] * 4 + [True] and logged[-1].next_observation


def test_a_session_stepped_without_flush_settles_the_last_step_at_the_next():
    router = HeardSteps()

    async def scenario():
        s = session(router)
        replies = [await s.handle(observation(step)) for step in range(len(REWARDS) - 1)]
        heard_before_last = len(router.steps)  # the last action's step is told at the next step (or flush)
        replies.append(await s.handle(observation(len(REWARDS) - 1)))
        return replies, heard_before_last

    replies, heard_before_last = asyncio.run(scenario())
    assert heard_before_last == len(REWARDS) - 2 and len(router.steps) == len(REWARDS) - 1
    assert replies[-1].episode_end.episode_return == sum(REWARDS[1:])
