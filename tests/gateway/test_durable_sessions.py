"""The experience log through the real gateway process: `kill -9` mid-stream, restart on the same
port and log, sims reconnect and replay; every answered step is logged exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import defaultdict

import numpy as np
import pytest
from mcap.reader import make_reader

from bridge.experience import read_transitions
from bridge.experience.segment import TOPIC
from protos import bridge_pb2
from protos.codec import encode
from sim.client import run_sessions
from sim.mujoco import make_env
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import gateway_process, running_gateway, start_gateway
from tests.support.waiting import until, wait_until

pytestmark = pytest.mark.slow


def check_log_is_every_answered_step_once(log_dir, sessions: int) -> dict[str, list[int]]:
    steps: dict[str, list[int]] = defaultdict(list)
    ended: dict[tuple[str, int], bool] = {}
    offsets = []
    for t in read_transitions(log_dir):
        steps[t.session].append(t.step)
        ended[(t.session, t.step)] = t.terminated or t.truncated
        offsets.append(t.offset)
    assert offsets == list(range(len(offsets))), "offsets are dense and in order"
    assert len(steps) == sessions
    for session, logged in steps.items():
        assert len(logged) == len(set(logged)), f"{session}: a step logged twice"
        assert logged == sorted(logged) and logged[0] == 0, session
        for a, b in zip(logged, logged[1:], strict=False):
            # the next logged step follows at once, or after the LAST observation that ended the episode
            assert b == a + (2 if ended[(session, a)] else 1), f"{session}: step {a} -> {b} lost something"
    messages = 0
    for segment in sorted(log_dir.glob("*.mcap")):
        with open(segment, "rb") as f:  # every file is a complete, readable MCAP file of transitions
            topics = [channel.topic for _, channel, _ in make_reader(f).iter_messages()]
        assert set(topics) <= {TOPIC}, (segment, set(topics))
        messages += len(topics)
    assert messages == len(offsets), "every message in the files is one transition the reader returns"
    return steps


def test_kill_9_mid_stream_then_restart_loses_and_duplicates_nothing(triton, tmp_path, unused_port):
    log_dir = tmp_path / "experience"
    first = start_gateway(triton.url, tmp_path / "gateway.log", "--experience-dir", log_dir, port=unused_port)
    address = f"127.0.0.1:{unused_port}"
    restarted = threading.Event()
    sessions_out = []

    def crash_and_restart():
        # kill once every session has had steps made durable (on state, not a sleep: a loaded machine starts slowly)
        wait_until(lambda: done.is_set() or len(sessions_out) == 3 and all(s.durable_through > 10
                                                                           for s in sessions_out),
                   "3 sessions with durable steps", timeout=60)
        if done.is_set():
            return
        os.kill(first.pid, signal.SIGKILL)
        first.proc.wait()
        time.sleep(0.3)
        with gateway_process(triton.url, tmp_path / "gateway.log", "--experience-dir", log_dir, port=unused_port):
            restarted.set()
            done.wait(60)

    done = threading.Event()
    crasher = threading.Thread(target=crash_and_restart)
    crasher.start()
    try:
        stats = asyncio.run(run_sessions(address, lambda i: make_env("Hopper-v5", seed=i, max_episode_steps=40),
                                         envs=3, seconds=5.0, reconnect_s=30.0, sessions_out=sessions_out))
    finally:
        done.set()
        crasher.join(30)
        first.stop()
    assert restarted.is_set() and stats.reconnects == 3
    assert not stats.errors, stats.errors
    steps = check_log_is_every_answered_step_once(log_dir, sessions=3)
    assert sum(len(v) for v in steps.values()) == stats.steps  # every env step the policy answered, once


def test_replay_logs_what_the_log_lacks_once_and_completes_the_pending_step(triton, tmp_path):
    """A client that lost its gateway resends steps 0..2 (2 without its successor); the new gateway
    logs them, drops the ones it already has, and the live step 3 completes step 2."""
    log_dir = tmp_path / "experience"

    def observation(step, step_type=bridge_pb2.MID, reward=1.0):
        return bridge_pb2.Observation(step=step, step_type=step_type, reward=reward, episode=0,
                                      tensors=[encode("observation", np.full(11, step, np.float32))])

    def action(step):
        return bridge_pb2.Action(step=step, policy="tiny", policy_version=1,
                                 tensors=[encode("action", np.full(3, 0.1 * step, np.float32))])

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", experience_dir=log_dir) as gw:
            async with RawSession(gw.address, hello("r1", obs=OBS, act=ACT)) as s:
                assert s.welcome.logging and s.welcome.durable_through == 0
                replies = []
                for step in range(3):
                    replay = bridge_pb2.Replay(observation=observation(step, bridge_pb2.FIRST if step == 0
                                                                       else bridge_pb2.MID), action=action(step))
                    if step < 2:
                        replay.next.CopyFrom(observation(step + 1, reward=10.0 + step))
                    await s.call.write(bridge_pb2.ClientMessage(replay=replay))
                    replies.append(await s.call.read())
                assert [r.replayed.step for r in replies] == [0, 1, 2]
                assert not any(r.replayed.duplicate for r in replies)
                again = bridge_pb2.Replay(observation=observation(1), action=action(1))
                await s.call.write(bridge_pb2.ClientMessage(replay=again))
                assert (await s.call.read()).replayed.duplicate
                live = await s.send([encode("observation", np.zeros(11, np.float32))], step=3, reward=12.0)
                assert live.WhichOneof("kind") == "action"
                await s.send([encode("observation", np.zeros(11, np.float32))], step=4, reward=13.0,
                             step_type=bridge_pb2.LAST)
            await until(lambda: not gw.sessions, "the gateway closed r1's stream")
        logged = list(read_transitions(log_dir))
        assert [(t.step, t.env_reward) for t in logged] == [(0, 10.0), (1, 11.0), (2, 12.0), (3, 13.0)]
        assert logged[2].action[0].data == action(2).tensors[0].data   # the replayed action, not a new one
        assert logged[3].truncated and logged[3].next_observation

        async with running_gateway(triton.url, policy="tiny", experience_dir=log_dir) as gw:
            async with RawSession(gw.address, hello("r1", obs=OBS, act=ACT)) as s:
                assert s.welcome.durable_through == 4   # after a restart: what the log has of r1

    asyncio.run(scenario())
