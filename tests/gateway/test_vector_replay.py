"""Replay for vectorised sessions, with a stochastic policy (a Gaussian MLP sampled in Triton, as PPO learns with):
after a gateway `kill -9` and restart on the same port and log, every env step the policy answered is logged exactly
once as `<session>/<i>`, each with the acting log-probability; a raw Replay's checks apply per row."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections import defaultdict

import numpy as np
import pytest

import sim
from bridge.experience import read_transitions
from protos import bridge_pb2
from protos.codec import Spec, encode
from sim.client import run_vector_sessions
from tests.gateway.helpers import RawSession
from tests.support.gateways import gateway_process, running_gateway, start_gateway
from tests.support.waiting import until, wait_until

pytestmark = pytest.mark.slow

ENV = "InvertedPendulum-v5"
N = 4
OBS, ACT = (Spec("observation", np.float32, (4,)),), (Spec("action", np.float32, (1,), low=(-3.0,), high=(3.0,)),)


@pytest.fixture(scope="module")
def gaussian(triton):
    """The learning loop's policy for InvertedPendulum-v5 (obs 4, action 1, log_prob) in the session's Triton."""
    return triton.server, triton.add_initial_policy(ENV)


def test_kill_9_mid_stream_vector_sessions_replay_and_log_every_answered_env_step_once(gaussian, tmp_path,
                                                                                        unused_port):
    server, name = gaussian
    log_dir, gateway_log = tmp_path / "experience", tmp_path / "gateway.log"
    args = ("--experience-dir", log_dir, "--fsync-interval-ms", "100")  # a longer group commit: more to replay
    first = start_gateway(server.grpc_url, gateway_log, *args, policy=name, port=unused_port)
    restarted, done = threading.Event(), threading.Event()
    sessions_out = []

    def crash_and_restart():
        # kill once both sessions have answered steps the log has not acknowledged to them (on state, not a sleep)
        wait_until(lambda: done.is_set() or len(sessions_out) == 2 and all(s.durable_through > 20 and s.unacked
                                                                           for s in sessions_out),
                   "both sessions with answered steps not yet durable", timeout=60, period=0.01)
        if done.is_set():
            return
        os.kill(first.pid, signal.SIGKILL)
        first.proc.wait()
        with gateway_process(server.grpc_url, gateway_log, *args, policy=name, port=unused_port):
            restarted.set()
            done.wait(60)

    crasher = threading.Thread(target=crash_and_restart)
    crasher.start()
    try:  # short episodes: many auto-resets (FIRST rows) on both sides of the kill
        stats = asyncio.run(run_vector_sessions(
            f"127.0.0.1:{unused_port}", lambda i: sim.make(f"mujoco:{ENV}", num_envs=N, seed=10 * i,
                                                           max_episode_steps=25),
            sessions=2, seconds=6.0, reconnect_s=30.0, sessions_out=sessions_out, session_prefix="vec"))
    finally:
        done.set()
        crasher.join(30)
        first.stop()
    assert restarted.is_set() and stats.reconnects == 2, stats.reconnects
    assert stats.replayed > 0 and not stats.errors, (stats.replayed, stats.errors)
    moves = [f for s in sessions_out for f in s.failovers]
    assert len(moves) == 2 and all(m.replayed for m in moves), moves

    steps: dict[str, list[int]] = defaultdict(list)
    offsets = []
    for t in read_transitions(log_dir):
        steps[t.session].append(t.step)
        offsets.append(t.offset)
        assert t.has_log_prob and np.isfinite(t.log_prob) and t.log_prob != 0.0, (t.session, t.step)
    assert offsets == list(range(len(offsets))), "offsets are dense and in order"
    assert sorted(steps) == sorted(f"vec-{s}/{i}" for s in range(2) for i in range(N))
    for key, logged in steps.items():  # every env has a transition at every step but the last answered one
        assert logged == list(range(len(logged))), f"{key}: a step lost or logged twice"
    answered = 0  # exchanges per session: each env logged all but the last (it has no successor)
    for s in sessions_out:
        lengths = {len(steps[f"{s.id}/{i}"]) for i in range(N)}
        assert len(lengths) == 1, (s.id, lengths)
        answered += lengths.pop() + 1
    assert answered * N == stats.steps, "every env step the policy answered, logged once"
    print(f"{stats.steps} env steps answered, {len(offsets)} transitions logged; replayed "
          f"{[len(m.replayed) for m in moves]} steps of {N} rows, resumed in {[round(m.seconds, 2) for m in moves]} s")


def _observation(step: int, step_types, value: float = 0.0, rewards=None) -> bridge_pb2.Observation:
    return bridge_pb2.Observation(step=step, env_step_types=step_types, env_rewards=rewards or [1.0] * N,
                                  tensors=[encode("observation", np.full((N, 4), value, np.float32))])


def _action(step: int, name: str, action: np.ndarray, log_prob) -> bridge_pb2.Action:
    return bridge_pb2.Action(step=step, policy=name, policy_version=1, log_prob=log_prob,
                             tensors=[encode("action", action.astype(np.float32))])


def test_vector_replay_checks_each_row_keeps_log_probs_and_logs_each_env_once(gaussian, tmp_path):
    server, name = gaussian
    log_dir = tmp_path / "experience"
    vector_hello = bridge_pb2.Hello(session_id="r", policy=name, source="test", num_envs=N, batched=True,
                                    observation_spec=[OBS[0].to_proto()], action_spec=[ACT[0].to_proto()])
    first_types = [bridge_pb2.FIRST] * N
    mid = [bridge_pb2.MID] * N

    async def replay(s: RawSession, obs, action) -> bridge_pb2.ServerMessage:
        await s.call.write(bridge_pb2.ClientMessage(replay=bridge_pb2.Replay(observation=obs, action=action)))
        return await s.call.read()

    async def scenario():
        async with running_gateway(server.grpc_url, policy=name, experience_dir=log_dir) as gw:
            async with RawSession(gw.address, vector_hello) as s:
                assert s.welcome.logging
                zeros = np.zeros((N, 1))
                bad = await replay(s, _observation(0, first_types), _action(0, name, zeros, [-1.0] * (N - 1)))
                assert bad.error.field == "action.log_prob" and "3 values for 4" in bad.error.message
                other = _action(0, "someone_else", zeros, [])
                assert (await replay(s, _observation(0, first_types), other)).error.field == "action.policy"
                nan_row = np.array([[0.1], [np.nan], [0.3], [0.4]])  # env 1's action is not finite: not logged
                ok = await replay(s, _observation(0, first_types), _action(0, name, nan_row, [-1.0, -2.0, -3.0, -4.0]))
                assert ok.replayed.step == 0 and not ok.replayed.duplicate
                ok = await replay(s, _observation(1, mid, 1.0, [10.0, 11.0, 12.0, 13.0]),
                                  _action(1, name, np.full((N, 1), 0.5), [-5.0, -6.0, -7.0, -8.0]))
                assert ok.replayed.step == 1
                again = await replay(s, _observation(1, mid, 1.0), _action(1, name, np.full((N, 1), 0.5), []))
                assert again.replayed.duplicate
                live = bridge_pb2.Observation(step=2, env_step_types=mid, env_rewards=[20.0, 21.0, 22.0, 23.0],
                                              tensors=[encode("observation", np.full((N, 4), 2.0, np.float32))])
                await s.call.write(bridge_pb2.ClientMessage(observation=live))
                reply = await s.call.read()
                assert reply.WhichOneof("kind") == "action" and len(reply.action.log_prob) == N  # kept for Replay
            await until(lambda: not gw.sessions, "the gateway closed r's stream")
        logged = {(t.session, t.step): t for t in read_transitions(log_dir)}
        assert sorted(logged) == [("r/0", 0), ("r/0", 1), ("r/1", 1), ("r/2", 0), ("r/2", 1), ("r/3", 0), ("r/3", 1)]
        assert [logged[("r/2", 0)].log_prob, logged[("r/2", 1)].log_prob] == [-3.0, -7.0]
        assert all(t.has_log_prob for t in logged.values())
        assert logged[("r/3", 0)].env_reward == 13.0 and logged[("r/3", 1)].env_reward == 23.0
        assert logged[("r/0", 0)].step_type == bridge_pb2.FIRST and logged[("r/1", 1)].step_type == bridge_pb2.MID

        async with running_gateway(server.grpc_url, policy=name, experience_dir=log_dir) as gw:
            async with RawSession(gw.address, vector_hello) as s:  # after a restart: per env, what the log has
                assert s.welcome.durable_through == 2 and s.welcome.next_step == 2
                dup = await replay(s, _observation(1, mid), _action(1, name, np.zeros((N, 1)), []))
                assert dup.replayed.duplicate
                fresh = await replay(s, _observation(2, mid), _action(2, name, np.zeros((N, 1)), [-9.0] * N))
                assert fresh.replayed.step == 2 and not fresh.replayed.duplicate
                held = _action(3, name, np.zeros((N, 1)), [])
                held.estop, held.estop_id = True, "e1"   # an operator's e-stop held step 3: step 2 gets no successor
                assert (await replay(s, _observation(3, mid), held)).replayed.step == 3
                live = bridge_pb2.Observation(step=4, env_step_types=mid, env_rewards=[1.0] * N,
                                              tensors=[encode("observation", np.zeros((N, 4), np.float32))])
                await s.call.write(bridge_pb2.ClientMessage(observation=live))
                assert (await s.call.read()).WhichOneof("kind") == "action"
            await until(lambda: not gw.sessions, "the gateway closed r's stream")
        assert max(t.step for t in read_transitions(log_dir)) == 1, "nothing of a step an e-stop held is logged"

    asyncio.run(scenario())


def test_single_env_replay_keeps_the_acting_log_prob(gaussian, tmp_path):
    server, name = gaussian
    log_dir = tmp_path / "experience"
    single = bridge_pb2.Hello(session_id="one", policy=name, source="test",
                              observation_spec=[OBS[0].to_proto()], action_spec=[ACT[0].to_proto()])

    def observation(step, step_type=bridge_pb2.MID):
        return bridge_pb2.Observation(step=step, step_type=step_type, reward=1.0,
                                      tensors=[encode("observation", np.full(4, 0.01 * step, np.float32))])

    async def scenario():
        async with running_gateway(server.grpc_url, policy=name, experience_dir=log_dir) as gw:
            async with RawSession(gw.address, single) as s:
                action = bridge_pb2.Action(step=0, policy=name, policy_version=1, log_prob=[-0.75],
                                           tensors=[encode("action", np.full(1, 0.2, np.float32))])
                replay = bridge_pb2.Replay(observation=observation(0, bridge_pb2.FIRST), action=action,
                                           next=observation(1))
                await s.call.write(bridge_pb2.ClientMessage(replay=replay))
                assert (await s.call.read()).replayed.step == 0
                live = await s.send([encode("observation", np.zeros(4, np.float32))], step=1, reward=1.0)
                assert live.WhichOneof("kind") == "action" and len(live.action.log_prob) == 1
            await until(lambda: not gw.sessions, "the gateway closed the stream")
        logged = list(read_transitions(log_dir))
        assert [(t.step, t.has_log_prob, t.log_prob) for t in logged] == [(0, True, -0.75)]

    asyncio.run(scenario())
