"""TeeLog.forget (the local log + the JetStream stream as one sink): when a session another gateway owned
since comes back (bridge.gateway.session.owners.claim), both sinks take its steps again from any step and its
durable step restarts; without it a gateway with `--experience-dir` and `--experience nats://` failed every
failover to it (AttributeError; found by tests/fleet/test_all_together.py). Two real local logs stand for
the two sinks here; the stream's own forget runs in the fleet tests."""

from __future__ import annotations

import asyncio

from bridge.experience.log import ExperienceLog
from bridge.experience.tee import TeeLog
from protos import experience_pb2


def _t(step: int, epoch: int) -> experience_pb2.Transition:
    return experience_pb2.Transition(session="robot-1", step=step, owner_epoch=epoch)


def test_forget_takes_a_returning_sessions_steps_again_in_both_sinks(tmp_path):
    async def run():
        async with ExperienceLog(tmp_path / "a", fsync=False) as a, ExperienceLog(tmp_path / "b", fsync=False) as b:
            tee = TeeLog(a, b)
            for step in range(3):
                await tee.append(_t(step, 1))
            assert tee.append(_t(1, 1)) is None  # a step it has: a duplicate
            assert tee.durable_step("robot-1") == 2
            tee.forget("robot-1")                  # another gateway owned robot-1 since; it is back, epoch 2
            assert tee.durable_step("robot-1") is None and tee.last_step("robot-1") is None
            again = tee.append(_t(1, 2))           # replayed under the new epoch: taken by both
            assert again is not None
            await again
            return tee.durable_step("robot-1")

    assert asyncio.run(run()) == 1
