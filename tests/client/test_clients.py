"""One client per `tether.v1` service against a real gateway (in this event loop, real Triton, gRPC over
loopback): Policies (versions and rollout, blocking and grpc.aio), Fleet (e-stops under the operator's
token), Experience (the logged transitions as a stream); and the credentials every client is built with,
from the one set of flags or from the environment."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch

from bridge.client import Credentials, ExperienceClient, FleetClient, PoliciesClient
from bridge.common.flags import gateway_flags
from bridge.security.tokens import TokenStore
from protos import bridge_pb2, experience_pb2
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import running_gateway


def test_credentials_come_from_the_one_set_of_flags_or_from_the_environment(monkeypatch):
    monkeypatch.setenv("TETHER_TOKEN", "alice.s3cret")
    parser = argparse.ArgumentParser()
    gateway_flags(parser)
    creds = Credentials.from_args(parser.parse_args(["--tls-ca", "ca.crt", "--tls-cert", "", "--tls-key", ""]))
    assert creds == Credentials(ca=Path("ca.crt"), token="alice.s3cret")  # an empty path is not given
    assert creds.env() == {"TETHER_TLS_CA": "ca.crt", "TETHER_TOKEN": "alice.s3cret"}
    assert Credentials.from_env(creds.env()) == creds            # what a launcher hands its children
    assert Credentials.from_args(parser.parse_args(["--token", ""])) == Credentials()
    with pytest.raises(ValueError, match="must be HOST:PORT"):
        FleetClient("gateway")


def test_the_policies_client_fetches_versions_and_steers_the_rollout(triton, tmp_path):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny", model_repository=triton.repo.root,
                                   registry=tmp_path / "registry.sqlite") as gw:
            def blocking():
                with PoliciesClient(gw.address, timeout_s=30, operator="bob") as client:
                    served = client.fetch("tiny")
                    pinned = client.pin("tiny", "robot=arm_1", 1, reason="hold arm_1")
                    return client.list().policy, served, pinned, client.pin("tiny", "robot=arm_1", 0, reason="free")

            listed, served, pinned, unpinned = await asyncio.to_thread(blocking)
            async with PoliciesClient(gw.address, aio=True, timeout_s=30) as client:
                status = await client.rollout_status("tiny", events=5)
                with pytest.raises(TypeError, match="blocking"):
                    client.fetch("tiny")
            return listed, served, pinned, unpinned, status

    listed, served, pinned, unpinned, status = asyncio.run(scenario())
    assert listed == "tiny" and (served.policy, served.version) == ("tiny", 1)
    assert [s.name for s in served.inputs] == [s.name for s in OBS]
    assert all(torch.equal(served.state_dict[k], v) for k, v in triton.module.state_dict().items())
    assert dict(pinned.rollout.pins) == {"robot=arm_1": 1} and not unpinned.rollout.pins
    assert status.rollout.live == 1
    assert [(e.kind, e.who, e.why) for e in status.events if e.kind == "pin"][-2:] == \
        [("pin", "operator:bob", "hold arm_1"), ("pin", "operator:bob", "free")]


def test_the_fleet_client_acts_with_the_operators_token_and_is_refused_without(triton, tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    alice = store.add("alice", role="operator")

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", tokens=store.path, anonymous_viewers=False) as gw:
            async with FleetClient(gw.address, aio=True) as anonymous:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await anonymous.status()

            def blocking():
                with FleetClient(gw.address, Credentials(token=alice)) as fleet:
                    latched = fleet.estop(robot="arm_1", reason="person in the cell")
                    held = [e.robot for e in fleet.status().estops]
                    return latched, held, fleet.release(robot="arm_1", reason="cell clear"), fleet.status()

            return refused.value.code(), *await asyncio.to_thread(blocking)

    refused, latched, held, released, after = asyncio.run(scenario())
    assert refused == grpc.StatusCode.UNAUTHENTICATED
    assert (latched.who, latched.changed, held) == ("operator:alice", True, ["arm_1"])
    assert released.changed and not after.estops


def test_the_experience_client_streams_what_a_session_logged(triton, tmp_path):
    async def scenario():
        async with running_gateway(triton.url, policy="tiny", experience_dir=tmp_path / "experience") as gw:
            async with RawSession(gw.address, hello("arm-1", obs=OBS, act=ACT)) as s:
                rng = np.random.default_rng(0)
                for step in range(4):
                    await s.step(rng.standard_normal(11).astype(np.float32),
                                 step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID)
            got: list[experience_pb2.Transition] = []
            async with ExperienceClient(gw.address, aio=True, timeout_s=30) as client:
                call = client.subscribe()
                await call.write(experience_pb2.SubscribeRequest(start=experience_pb2.SubscribeStart()))
                while len(got) < 3:  # 4 observations: 3 complete transitions, the 4th awaits its successor
                    batch = await call.read()
                    got += batch.transitions
                    await call.write(experience_pb2.SubscribeRequest(
                        ack=experience_pb2.SubscribeAck(through_offset=batch.next_offset)))
                call.cancel()
            return got

    got = asyncio.run(scenario())
    assert [t.session for t in got] == ["arm-1"] * len(got) and [t.step for t in got][:3] == [0, 1, 2]
