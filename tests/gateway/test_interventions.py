"""A person's interventions as data, through a real gateway and Triton: sessions (one env, and vectorised) that
report `Observation.intervention` / `env_interventions` get them logged as `Transition.intervention` (the policy's
own action beside the applied one), and per version in RolloutStatus' VersionStats (intervention_steps,
intervention_rate) and in the regression monitor's figures (what promotions and rollbacks record)."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from bridge.experience import read_transitions
from protos import bridge_pb2, policies_pb2, policies_pb2_grpc
from protos.codec import decode, encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import running_gateway
from tests.support.waiting import until
from tether.rollout_cli import render

N = 4                       # envs of the vectorised session
PERSON = np.array([0.9, -0.9, 0.5], np.float32)   # what the person's command applied
STEPS = 10                  # MID steps of the single-env episode
FLAGGED = {3, 4, 5}         # observations whose previous step a person acted


async def _send(s: RawSession, obs: bridge_pb2.Observation) -> bridge_pb2.ServerMessage:
    await s.call.write(bridge_pb2.ClientMessage(observation=obs))
    return await s.call.read()


def test_interventions_are_logged_and_counted_per_version(triton, tmp_path):
    triton.add_policy("iv")
    log_dir = tmp_path / "experience"
    rng = np.random.default_rng(0)

    vector_applied: dict[int, np.ndarray] = {}   # step -> the (N, 3) rows the vector session reported applied

    async def scenario():
        async with running_gateway(triton.url, triton_timeout_s=60, policy="iv", **triton.publishing(tmp_path),
                                   experience_dir=log_dir) as gw, grpc.aio.insecure_channel(gw.address) as channel:
            async with RawSession(gw.address, hello("one", obs=OBS, act=ACT, policy="iv")) as s:
                for t in range(STEPS + 2):
                    kind = bridge_pb2.FIRST if t == 0 else bridge_pb2.LAST if t == STEPS + 1 else bridge_pb2.MID
                    obs = bridge_pb2.Observation(step=t, step_type=kind, reward=1.0, intervention=t in FLAGGED,
                                                 tensors=[encode("observation", rng.standard_normal(11, np.float32))])
                    if t in FLAGGED:   # the edge reports the person's command as applied
                        obs.applied_action.append(encode("action", PERSON))
                    reply = await _send(s, obs)
                    assert reply.WhichOneof("kind") == ("episode_end" if t == STEPS + 1 else "action"), reply
            vector = bridge_pb2.Hello(session_id="vec", policy="iv", source="test", num_envs=N, batched=True,
                                      observation_spec=[OBS[0].to_proto()], action_spec=[ACT[0].to_proto()])
            async with RawSession(gw.address, vector) as s:
                acted = None
                for t in range(3):   # step 1 reports env 2 and step 2 envs 0, 2 as a person's
                    flags = [[False] * N, [False, False, True, False], [True, False, True, False]][t]
                    rows = rng.standard_normal((N, 11), np.float32)
                    obs = bridge_pb2.Observation(step=t, env_step_types=[bridge_pb2.MID if t else bridge_pb2.FIRST] * N,
                                                 env_rewards=[1.0] * N, env_interventions=flags,
                                                 tensors=[encode("observation", rows)])
                    if acted is not None:   # what each env applied: the policy's rows, a person's where flagged
                        applied = np.where(np.array(flags)[:, None], PERSON, acted)
                        obs.applied_action.append(encode("action", applied.astype(np.float32)))
                        vector_applied[t - 1] = applied
                    reply = await _send(s, obs)
                    assert reply.WhichOneof("kind") == "action"
                    acted = decode(reply.action.tensors[0])
                bad = bridge_pb2.Observation(step=3, env_step_types=[bridge_pb2.MID] * N, env_rewards=[1.0] * N,
                                             env_interventions=[True],
                                             tensors=[encode("observation", np.zeros((N, 11), np.float32))])
                error = (await _send(s, bad)).error
                assert error.field == "env_interventions" and "1 values for 4 envs" in error.message
            await until(lambda: not gw.sessions, "the gateway closed both streams")
            status = await policies_pb2_grpc.PoliciesStub(channel).RolloutStatus(
                policies_pb2.RolloutStatusRequest(policy="iv"))
            figures = gw.rollout.router.monitor("iv").summary(1)
            odd = bridge_pb2.Hello(session_id="odd", policy="iv", source="test", num_envs=N, batched=True,
                                   observation_spec=[OBS[0].to_proto()], action_spec=[ACT[0].to_proto()])
            async with RawSession(gw.address, odd) as s:   # (after the figures: its steps are not in them)
                zeros = np.zeros((N, 11), np.float32)
                first = bridge_pb2.Observation(step=0, env_step_types=[bridge_pb2.FIRST] * N,
                                               tensors=[encode("observation", zeros)])
                assert (await _send(s, first)).WhichOneof("kind") == "action"
                nan = np.zeros((N, 3), np.float32)
                nan[1] = np.nan   # env 1 reports a non-finite applied action: that env's step fails, the others act
                bad_row = bridge_pb2.Observation(step=1, env_step_types=[bridge_pb2.MID] * N, env_rewards=[1.0] * N,
                                                 applied_action=[encode("action", nan)],
                                                 tensors=[encode("observation", zeros)])
                reply = (await _send(s, bad_row)).action
                assert [(e.env, e.field) for e in reply.env_errors] == [(1, "applied_action.action")], reply.env_errors
        v1 = next(v for v in status.versions if v.version == 1).stats
        # one env: 11 acted steps, 3 a person's; vector: 3 steps, 3 env steps a person's of the 8 completed
        assert v1.intervention_steps == 3 + 3
        assert v1.intervention_rate == pytest.approx(6 / (11 + 8))
        assert figures["intervention_rate"] == pytest.approx((3 + 1 / 4 + 2 / 4) / (11 + 3))
        table = render(status).splitlines()   # tether rollout list: the "person" column
        assert "person" in table[1].split() and "31.6%" in next(line for line in table if line.startswith("v1 "))
        return v1

    v1 = asyncio.run(scenario())
    logged = {(t.session, t.step): t for t in read_transitions(log_dir)}
    one = [logged[("one", t)] for t in range(STEPS + 1)]
    assert [t.step for t in one if t.intervention] == [f - 1 for f in sorted(FLAGGED)]
    for t in one:
        applied, action = decode(t.applied_action[0]), decode(t.action[0])
        if t.intervention:    # the person's command applied, the policy's own action beside it
            assert np.array_equal(applied, PERSON) and not np.allclose(action, PERSON)
        else:
            assert np.array_equal(applied, action)
    flagged = sorted((s, t.step) for (s, _), t in logged.items() if s.startswith("vec/") and t.intervention)
    assert flagged == [("vec/0", 1), ("vec/2", 0), ("vec/2", 1)]
    reported = [(session, step, t) for (session, step), t in logged.items()
                if session.startswith("vec/") and step in vector_applied]
    assert len(reported) == 2 * N, sorted((session, step) for session, step, _ in reported)
    for session, step, t in reported:   # each env's logged applied action is its row of what was reported
        row = vector_applied[step][int(session.split("/")[1])]
        assert np.array_equal(decode(t.applied_action[0]), row), (session, step)
        assert np.array_equal(row, PERSON) == t.intervention
    print(f"\nVersionStats v1: intervention_steps {v1.intervention_steps}, rate {v1.intervention_rate:.3f}")
