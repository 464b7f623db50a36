"""A Replay (its observation, action and next) and a live observation's `applied_action` get every check a
live observation gets, against the session's specs: a NaN, a wrong shape or a stray name is a StepError
naming the field, never a logged transition; the session goes on. Real gateway, real Triton, real log."""

from __future__ import annotations

import asyncio

import numpy as np

from bridge.experience.reader import read_transitions
from protos import bridge_pb2
from protos.codec import decode, encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import running_gateway

NAN3 = np.array([0.1, np.nan, 0.1], np.float32)


def observation(step, *, step_type=bridge_pb2.MID, reward=1.0, obs=None, applied=None):
    o = bridge_pb2.Observation(step=step, step_type=step_type, reward=reward, episode=0,
                               tensors=[encode("observation", np.full(11, step, np.float32) if obs is None else obs)])
    if applied is not None:
        o.applied_action.append(encode("action", applied))
    return o


def action(step, value=None):
    return bridge_pb2.Action(step=step, policy="tiny", policy_version=1,
                             tensors=[encode("action", np.full(3, 0.1, np.float32) if value is None else value)])


def replay(step, *, act=None, nxt=None, obs=None):
    r = bridge_pb2.Replay(observation=observation(step, step_type=bridge_pb2.FIRST, obs=obs), action=action(step, act))
    r.next.CopyFrom(nxt if nxt is not None else observation(step + 1, reward=10.0))
    return r


async def send(session: RawSession, obs: bridge_pb2.Observation) -> bridge_pb2.ServerMessage:
    await session.call.write(bridge_pb2.ClientMessage(observation=obs))
    return await session.call.read()


def test_a_poisoned_replay_or_applied_action_is_a_step_error_and_never_logged(triton, tmp_path):
    log_dir = tmp_path / "experience"
    poisoned = {
        "action.action": replay(0, act=NAN3),
        "action.action shape": replay(0, act=np.zeros(4, np.float32)),
        "next.reward": replay(0, nxt=observation(1, reward=float("nan"))),
        "next.applied_action.action": replay(0, nxt=observation(1, applied=NAN3)),
        "next.observation": replay(0, nxt=observation(1, obs=np.full(11, np.inf, np.float32))),
        "observation.observation": replay(0, obs=np.full(11, np.nan, np.float32)),
        "action.policy": replay(0),
    }
    poisoned["action.policy"].action.policy = "someone-else"

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", experience_dir=log_dir) as gw:
            async with RawSession(gw.address, hello("p1", obs=OBS, act=ACT)) as s:
                errors = {}
                for what, message in poisoned.items():
                    await s.call.write(bridge_pb2.ClientMessage(replay=message))
                    errors[what] = (await s.call.read()).error
                await s.call.write(bridge_pb2.ClientMessage(replay=replay(0)))       # the good one: logged
                good = await s.call.read()
                live = {"nan applied": await send(s, observation(1, reward=0.0, applied=NAN3))}
                live["act"] = await send(s, observation(2, reward=0.0))
                live["last"] = await send(s, observation(3, reward=0.0, step_type=bridge_pb2.LAST,
                                                         applied=np.full(3, 0.5, np.float32)))
                counted = dict(gw.sessions["p1"].stats.errors)
            return errors, good, live, counted

    errors, good, live, counted = asyncio.run(scenario())  # the gateway stopped: its log is closed and complete
    for what, error in errors.items():
        field = what.split(" ")[0]
        assert error.code == bridge_pb2.StepError.INVALID_OBSERVATION and error.field == field, (what, error)
        assert error.message.startswith("replay: "), error.message
    assert "NaN" in errors["action.action"].message and "shape [4]" in errors["action.action shape"].message
    assert good.replayed.step == 0 and not good.replayed.duplicate
    assert live["nan applied"].error.field == "applied_action.action", live["nan applied"]
    assert live["act"].WhichOneof("kind") == "action" and live["last"].WhichOneof("kind") == "episode_end"
    assert counted == {"INVALID_OBSERVATION": len(poisoned) + 1}
    logged = list(read_transitions(log_dir))
    assert [(t.step, t.env_reward) for t in logged] == [(0, 10.0), (2, 0.0)]
    for t in logged:
        for tensors in (t.observation, t.action, t.applied_action, t.next_observation):
            assert all(np.isfinite(decode(x)).all() for x in tensors), t
    assert decode(logged[1].applied_action[0]).tolist() == [0.5, 0.5, 0.5]
