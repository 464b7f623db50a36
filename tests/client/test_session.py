"""`bridge.client.Session` against an in-process gateway and a real Triton: the first address of the
list is dead, the session opens on the second; a list of gateways is given to `tether sim`'s runner."""

from __future__ import annotations

import asyncio

import pytest

from bridge.client import Session, SessionError
from bridge.common.processes import free_port as _port
from sim.client import run_sessions
from sim.mujoco import make_env
from tests.support.gateways import running_gateway


def test_a_dead_first_address_is_skipped_and_the_session_runs_on_the_next(triton):
    dead = f"127.0.0.1:{_port()}"
    sessions: list[Session] = []

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            stats = await run_sessions([dead, gw.address], lambda i: make_env("Hopper-v5", seed=i), envs=2,
                                       steps=40, connect_timeout=10.0, sessions_out=sessions)
            return stats, gw.address

    stats, live = asyncio.run(scenario())
    assert stats.steps == 40 and stats.sessions == 2 and not stats.errors
    assert [s.address for s in sessions] == [live, live]
    assert all(s.reconnects == 0 for s in sessions)


def test_no_address_answering_is_a_connection_error_naming_them():
    dead = [f"127.0.0.1:{_port()}", f"127.0.0.1:{_port()}"]
    with pytest.raises(ConnectionError, match="not reachable") as info:
        asyncio.run(run_sessions(dead, lambda i: make_env("Hopper-v5", seed=i), envs=1, steps=5,
                                 connect_timeout=1.0))
    assert all(address in str(info.value) for address in dead)


def test_a_refused_hello_is_a_session_error_with_the_gateways_status(triton):
    import grpc
    import numpy as np

    from protos.codec import Spec
    from tests.conftest import OBS
    from tests.gateway.helpers import hello

    async def scenario():
        async with running_gateway(triton.url, policy="tiny") as gw:
            async with Session(gw.address, hello("bad", obs=OBS, act=(Spec("action", np.float32, (4,)),))):
                pass

    with pytest.raises(SessionError, match="action_spec 'action' is float32\\[4\\]") as info:
        asyncio.run(scenario())
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
