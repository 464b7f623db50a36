"""Vectorised sessions (Hello.num_envs = N) through the real gateway and the real Triton: N MuJoCo
envs (gymnasium SyncVectorEnv) or Newton worlds on one stream, per-env episodes, per-env errors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bridge.client import Session
from protos import bridge_pb2
from protos.codec import decode_all, encode
from sim.client import run_vector_sessions, vector_observation
from sim.gym_vector import GymnasiumVectorEnv
from tests.support.gateways import running_gateway
from tests.support.waiting import until


class VectorStream(Session):
    """`async with VectorStream(addr, env) as s: reply = await s.send(obs)`: a `bridge.client.Session` with
    the vector Hello of `env` (N = env.num_envs)."""

    def __init__(self, address: str, env, *, session_id: str = "", policy: str = "", **hello):
        super().__init__(address, bridge_pb2.Hello(
            session_id=session_id, policy=policy, source="test-vector",
            observation_spec=[s.to_proto() for s in env.observation_spec()],
            action_spec=[s.to_proto() for s in env.action_spec()], num_envs=env.num_envs, **hello),
            connect_timeout_s=30.0, reply_timeout_s=30.0)

    async def send(self, obs: bridge_pb2.Observation) -> bridge_pb2.ServerMessage:
        return await self.step(obs)


def _local_episodes(env_id: str, n: int, actions: list[np.ndarray], **kw) -> list[tuple[int, int, float]]:
    """(env, length, return) of every episode that ends when the same envs step the same actions."""
    env = GymnasiumVectorEnv(env_id, num_envs=n, seed=0, **kw)
    env.reset()
    length, ret, ended = np.zeros(n, int), np.zeros(n), []
    for action in actions:
        ts = env.step({"action": action})
        length += 1
        ret += ts.reward
        for i in np.flatnonzero(ts.last()):
            ended.append((int(i), int(length[i]), float(ret[i])))
            length[i], ret[i] = 0, 0.0
    env.close()
    return ended


def test_vector_session_matches_the_same_envs_stepped_locally(triton):
    n, steps = 4, 40

    async def scenario():
        env = GymnasiumVectorEnv("Hopper-v5", num_envs=n, seed=0, max_episode_steps=15)
        ends, actions = [], []
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with VectorStream(gw.address, env) as s:
                ts = env.reset()
                for step in range(steps):
                    reply = await s.send(vector_observation(step, ts))
                    assert reply.WhichOneof("kind") == "action", reply
                    action = decode_all(reply.action.tensors)["action"]
                    assert action.shape == (n, 3) and not reply.action.env_errors
                    expected = np.stack([triton.expected_action(row) for row in ts.observation["observation"]])
                    np.testing.assert_allclose(action, expected, rtol=1e-5, atol=1e-6)
                    ends += [(e.env, e.length, e.episode_return, e.episode) for e in reply.action.episode_ends]
                    assert all(e.step == step and e.reason == "" for e in reply.action.episode_ends)
                    actions.append(action)
                    ts = env.step({"action": action})
            await until(lambda: len(gw.closed_stats) == 1 and not gw.sessions, "the gateway closed the stream")
            closed = list(gw.closed_stats)
            batches = gw.batcher.stats
        env.close()
        return ends, actions, closed, batches

    ends, actions, closed, batches = asyncio.run(scenario())
    # the gateway reports an episode's end at the observation after the local step that ended it
    local = _local_episodes("Hopper-v5", n, actions[:-1], max_episode_steps=15)
    assert len(local) >= n  # every env ended at least one episode (the time limit is 15 steps)
    assert sorted((env, length) for env, length, _, _ in ends) == sorted((env, length) for env, length, _ in local)
    got = {(env, length, round(ret, 9)) for env, length, ret, _ in ends}
    assert got == {(env, length, round(ret, 9)) for env, length, ret in local}
    for i in range(n):  # per-env episode counters: 1, 2, ...
        assert [e[3] for e in ends if e[0] == i] == list(range(1, 1 + sum(1 for e in ends if e[0] == i)))
    assert closed[-1].steps == n * steps and closed[-1].episodes == len(local)
    assert batches.rows == n * steps and batches.requests == steps  # one Triton request per vector step


def test_one_envs_nan_fails_that_env_only(triton):
    n = 3

    async def scenario():
        env = GymnasiumVectorEnv("Hopper-v5", num_envs=n, seed=1)
        ts = env.reset()
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with VectorStream(gw.address, env) as s:
                first = await s.send(vector_observation(0, ts))
                ts = env.step({"action": decode_all(first.action.tensors)["action"]})
                obs = vector_observation(1, ts)
                rows = ts.observation["observation"].copy()
                rows[1, 4] = np.nan
                del obs.tensors[:]
                obs.tensors.append(encode("observation", rows))
                bad = await s.send(obs)
                malformed = vector_observation(2, ts)
                del malformed.env_step_types[:]
                wrong_shape = vector_observation(3, ts)
                del wrong_shape.tensors[:]
                wrong_shape.tensors.append(encode("observation", rows[:2]))
                replies = [await s.send(malformed), await s.send(wrong_shape)]
                after = await s.send(vector_observation(4, ts))
        env.close()
        return rows, bad, replies, after

    rows, bad, (malformed, wrong_shape), after = asyncio.run(scenario())
    assert bad.WhichOneof("kind") == "action"
    [err] = bad.action.env_errors
    assert (err.env, err.field, err.code) == (1, "observation", bridge_pb2.StepError.INVALID_OBSERVATION)
    assert "env 1" in err.message and "NaN" in err.message
    action = decode_all(bad.action.tensors)["action"]
    assert action[1].tolist() == [0.0, 0.0, 0.0]  # the safe action: zero, inside [-1, 1]
    for i in (0, 2):
        np.testing.assert_allclose(action[i], triton.expected_action(rows[i]), rtol=1e-5, atol=1e-6)
    # a malformed batch is one StepError naming the field; the session goes on
    assert malformed.error.field == "env_step_types" and "0 values for 3 envs" in malformed.error.message
    assert wrong_shape.error.field == "observation" and "[2, 11]" in wrong_shape.error.message
    assert after.WhichOneof("kind") == "action" and not after.action.env_errors


def test_newton_cartpole_through_the_full_loop(triton):
    """A Newton task (many worlds in one model, on the CPU through Warp) through gateway and Triton."""
    pytest.importorskip("newton")
    import torch

    from sim.newton_tasks import NewtonCartpole
    from trainer.policy import MLPPolicy

    n, steps = 16, 30
    env = NewtonCartpole(num_envs=n, seed=0, max_episode_steps=10)
    obs_spec, act_spec = env.observation_spec(), env.action_spec()
    module = MLPPolicy(obs_spec[0], act_spec[0], seed=1).eval()
    triton.repo.write_version(triton.claim("newton_cartpole"), 1, module, obs_spec, act_spec)
    triton.server.load_model("newton_cartpole")

    async def scenario():
        ends, total = [], 0
        async with running_gateway(triton.url) as gw:
            async with VectorStream(gw.address, env, policy="newton_cartpole") as s:
                ts = env.reset()
                for step in range(steps):
                    reply = await s.send(vector_observation(step, ts))
                    assert reply.WhichOneof("kind") == "action" and not reply.action.env_errors, reply
                    action = decode_all(reply.action.tensors)["action"]
                    with torch.no_grad():
                        expected = module(torch.from_numpy(ts.observation["observation"])).numpy()
                    np.testing.assert_allclose(action, expected, rtol=1e-5, atol=1e-6)
                    ends += list(reply.action.episode_ends)
                    ts = env.step({"action": action})
                    total += ts.reward.sum()
        return ends

    ends = asyncio.run(scenario())
    env.close()
    assert len(ends) >= n  # 10-step time limit: every world ended at least two episodes in 30 steps
    assert {e.env for e in ends} == set(range(n)) and all(1 <= e.length <= 10 for e in ends)


def test_sim_client_runs_vector_sessions(triton, capsys):
    """`run_vector_sessions` and `tether sim --sessions M --envs N`: M streams of N envs each."""
    from sim.cli import main
    from sim.registry import make_vector_env

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            stats = await run_vector_sessions(
                gw.address, lambda i: make_vector_env("Hopper-v5", num_envs=8, seed=10 * i, max_episode_steps=10),
                sessions=2, steps=320)
            await until(lambda: len(gw.closed_stats) == 2 and not gw.sessions, "the gateway closed both streams")
            closed = list(gw.closed_stats)
            rc = await asyncio.to_thread(main, ["--gateway", gw.address, "--env", "Hopper-v5", "--sessions", "2",
                                                "--envs", "4", "--steps", "80", "--max-episode-steps", "5"])
            return stats, closed, rc

    stats, closed, rc = asyncio.run(scenario())
    assert stats.sessions == 2 and stats.steps == 320 and not stats.errors
    assert stats.policy_versions == {1: 320} and stats.episodes >= 16  # a 10-step limit: 20 steps per env
    # the budget is shared: how the 320 steps split between the two streams is the scheduler's (152/168 under load)
    per_stream = [s.steps for s in closed[-2:]]
    assert sum(per_stream) == 320 and all(n > 0 and n % 8 == 0 for n in per_stream), per_stream  # 8 per exchange
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and '"steps": 80' in out and '"sessions": 2' in out


def test_each_env_logs_its_own_transitions(triton, tmp_path):
    """With an experience log, env i's transitions are session "<id>/<i>": its steps, its episodes,
    terminated/truncated where its episodes ended, and the terminal observation there."""
    from bridge.experience.reader import LogCursor

    n, steps = 3, 12
    finals: dict[tuple[int, int], np.ndarray] = {}  # (env, step of the LAST observation) -> terminal observation

    async def scenario():
        env = GymnasiumVectorEnv("Hopper-v5", num_envs=n, seed=2, max_episode_steps=5)
        async with running_gateway(triton.url, policy="tiny", experience_dir=tmp_path / "log") as gw:
            async with VectorStream(gw.address, env, session_id="v") as s:
                assert s.welcome.logging
                ts = env.reset()
                for step in range(steps):
                    for i in np.flatnonzero(ts.last()):
                        finals[(int(i), step)] = ts.final_observation["observation"][i].copy()
                    reply = await s.send(vector_observation(step, ts))
                    ts = env.step(decode_all(reply.action.tensors))
        env.close()

    asyncio.run(scenario())
    cursor = LogCursor(tmp_path / "log")
    logged = cursor.read(max_count=1000, follow=False)
    cursor.close()
    assert {t.session for t in logged} == {f"v/{i}" for i in range(n)}
    for i in range(n):
        mine = sorted((t for t in logged if t.session == f"v/{i}"), key=lambda t: t.step)
        assert [t.step for t in mine] == list(range(steps - 1))  # the last step is never completed
        ended = [t for t in mine if t.terminated or t.truncated]
        assert [t.step + 1 for t in ended] == sorted(step for env, step in finals if env == i)
        for t in ended:
            np.testing.assert_array_equal(decode_all(t.next_observation)["observation"], finals[(i, t.step + 1)])
        assert all(not t.next_observation for t in mine if t not in ended)
        episodes = [t.episode for t in mine]
        assert episodes == sorted(episodes) and episodes[-1] == len(ended) - (mine[-1] in ended)
