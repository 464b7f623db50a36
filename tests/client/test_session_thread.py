"""`SessionThread` (the edge's way to the client) against real `tether gateway` processes: a blocking
caller submits steps, the first gateway is killed with kill -9, the thread reports down then up, and the
session goes on at the second gateway with Replay; every step is answered once, in order."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

from bridge.client import SessionThread
from bridge.experience import read_transitions
from protos.codec import encode
from protos.tether.v1 import bridge_pb2
from tests.conftest import ACT, OBS
from tests.gateway.helpers import hello
from tests.support.gateways import start_gateways
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

STEPS = 300


def _observation(step: int) -> bridge_pb2.Observation:
    return bridge_pb2.Observation(step=step, step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID,
                                  reward=1.0, tensors=[encode("observation", np.full(11, step / STEPS, np.float32))])


def test_session_thread_fails_over_with_replay_for_a_blocking_caller(triton, tmp_path):
    gateways = start_gateways(triton.url, tmp_path)
    addresses = [gw.address for gw in gateways]
    events: list[str] = []
    lock = threading.Lock()

    def note(what: str) -> None:
        with lock:
            events.append(what)

    link = SessionThread(addresses, hello("edge-1", obs=OBS, act=ACT, policy="tiny"), reconnect_s=60.0,
                         on_up=lambda w: note(f"up {w.session_id}"), on_down=lambda why: note("down"))
    replies: list[bridge_pb2.ServerMessage] = []
    try:
        link.start()
        assert link.wait_up(60), "the first gateway welcomed the session"
        for step in range(STEPS):
            if step == STEPS // 2:
                os.kill(gateways[0].pid, signal.SIGKILL)
            observation = _observation(step)
            future = wait_until(lambda o=observation: link.submit(o), f"the session up again for step {step}",
                                timeout=60)
            replies.append(future.result(timeout=60))
    finally:
        link.close()
        for gateway in gateways:
            gateway.stop()
    assert [r.WhichOneof("kind") for r in replies] == ["action"] * STEPS
    assert [r.action.step for r in replies] == list(range(STEPS))
    assert link.error is None
    session = link.session
    assert session.address == addresses[1] and session.reconnects == 1, (session.address, events)
    assert events[0] == "up edge-1" and "down" in events and events[-1] == "up edge-1", events
    [move] = session.failovers
    assert move.replayed, "the steps the first gateway had not acknowledged were replayed to the second"
    # steps 0..STEPS-2 are complete transitions (the last waits for its successor): none lost
    logged = {t.step for i in (0, 1) for t in read_transitions(tmp_path / f"experience-{i}")}
    assert logged == set(range(STEPS - 1)), sorted(set(range(STEPS - 1)) ^ logged)
