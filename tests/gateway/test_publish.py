"""Publishing versions through tether.v1.Policies to a real Triton; sessions follow at episode starts."""

from __future__ import annotations

import asyncio
import hashlib

import grpc
import numpy as np
import pytest
import safetensors.torch
import torch

from protos import bridge_pb2, policies_pb2, policies_pb2_grpc
from protos.codec import decode, encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from tests.support.gateways import running_gateway
from trainer.policy import MLPPolicy


@pytest.fixture(scope="module")
def publishing(triton, tmp_path_factory) -> dict:
    """v1 of `pub` in the session's Triton; gateways publish into its repository with this module's registry
    (what the module publishes goes with the module's models at its end)."""
    triton.add_policy("pub")
    return triton.publishing(tmp_path_factory.mktemp("publish"))


async def fetch(stub, version=0):
    chunks = [c async for c in stub.Fetch(policies_pb2.FetchRequest(policy="pub", version=version, chunk_bytes=4096))]
    header, data = chunks[0].header, b"".join(c.data for c in chunks[1:])
    assert len(data) == header.size and hashlib.sha256(data).hexdigest() == header.sha256
    return header, safetensors.torch.load(data)


async def publish(stub, weights, *, probe_outputs=None, parent=1, chunk=4096):
    module = MLPPolicy(OBS[0], ACT[0])
    module.load_state_dict(weights, strict=probe_outputs is None)
    probe = np.random.default_rng(0).standard_normal((4, 11)).astype(np.float32)
    with torch.no_grad():
        reference = module(torch.from_numpy(probe)).numpy() if probe_outputs is None else probe_outputs
    data = safetensors.torch.save(weights)
    header = policies_pb2.PublishHeader(
        policy="pub", format="safetensors", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
        lineage=policies_pb2.Lineage(parent_version=parent, trainer_step=7, trainer="test"),
        probe_inputs=[encode("observation", probe)], probe_outputs=[encode("action", reference)])
    chunks = [policies_pb2.PublishChunk(header=header)]
    chunks += [policies_pb2.PublishChunk(data=data[i:i + chunk]) for i in range(0, len(data), chunk)]
    return await stub.Publish(iter(chunks)), module


def scaled(weights, factor):
    return {k: (v * factor if k.startswith("net.") else v).contiguous() for k, v in weights.items()}


def test_publish_verifies_and_sessions_move_at_their_next_episode(triton, publishing):
    obs = np.linspace(-1, 1, 11).astype(np.float32)

    async def scenario():
        async with running_gateway(triton.url, policy="pub", **publishing) as gw:
            async with grpc.aio.insecure_channel(gw.address) as channel:
                stub = policies_pb2_grpc.PoliciesStub(channel)
                header, weights = await fetch(stub)
                assert header.format == "safetensors" and "net.0.weight" in weights
                async with RawSession(gw.address, hello("mover", obs=OBS, act=ACT)) as s:
                    first = await s.step(obs, step_type=bridge_pb2.FIRST)
                    assert first.action.policy_version == 1
                    reply, module = await publish(stub, scaled(weights, 1.5))
                    assert reply.version == 2 and 2 in reply.ready_versions and reply.max_abs_error < 1e-4
                    mid = await s.step(obs)              # mid-episode: still the version it started with
                    assert mid.action.policy_version == 1
                    await s.step(obs, step_type=bridge_pb2.LAST)
                    new = await s.step(obs, step_type=bridge_pb2.FIRST)
                    assert new.action.policy_version == 2
                    with torch.no_grad():
                        expected = module(torch.from_numpy(obs[None])).numpy()[0]
                    np.testing.assert_allclose(decode(new.action.tensors[0]), expected, rtol=1e-5, atol=1e-5)
                listed = await stub.List(policies_pb2.ListRequest(policy="pub"))
                assert listed.newest == 2 and [i.name for i in listed.inputs] == ["observation"]
                v2 = [v for v in listed.versions if v.version == 2][0]
                assert v2.lineage.parent_version == 1 and v2.lineage.trainer_step == 7 and v2.sha256 == reply.sha256
                _, served_weights = await fetch(stub, 2)
                torch.testing.assert_close(served_weights["net.0.weight"], weights["net.0.weight"] * 1.5)

    asyncio.run(scenario())


def test_bad_versions_are_refused_naming_why_and_the_live_one_keeps_serving(triton, publishing):
    obs = np.zeros(11, np.float32)

    async def scenario():
        async with running_gateway(triton.url, policy="pub", **publishing) as gw:
            async with grpc.aio.insecure_channel(gw.address) as channel:
                stub = policies_pb2_grpc.PoliciesStub(channel)
                _, weights = await fetch(stub)
                live = gw.catalog.current("pub").version
                nan = dict(weights, **{"net.0.bias": torch.full_like(weights["net.0.bias"], float("nan"))})
                with pytest.raises(grpc.aio.AioRpcError) as bad:
                    await publish(stub, nan)
                assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "integrity: weight 'net.0.bias' has 64 non-finite values" in bad.value.details()
                missing = {k: v for k, v in weights.items() if k != "net.2.weight"}
                with pytest.raises(grpc.aio.AioRpcError, match="integrity: missing tensors \\['net.2.weight'\\]"):
                    await publish(stub, missing, probe_outputs=np.zeros((4, 3), np.float32))
                wrong = np.full((4, 3), 0.5, np.float32)  # a "wrong export": Triton will not reproduce it
                with pytest.raises(grpc.aio.AioRpcError) as stale:
                    await publish(stub, scaled(weights, 0.5), probe_outputs=wrong)
                assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "rejected by the gate: consistency" in stale.value.details()
                assert gw.catalog.current("pub").version == live
                assert max(await gw.control.ready_versions("pub")) == live   # the failed one was withdrawn
                async with RawSession(gw.address, hello("steady", obs=OBS, act=ACT)) as s:
                    reply = await s.step(obs, step_type=bridge_pb2.FIRST)
                    assert reply.action.policy_version == live

    asyncio.run(scenario())


def test_a_gateway_without_a_repository_says_it_cannot_publish(triton, publishing):

    async def scenario():
        async with running_gateway(triton.url, policy="pub") as gw:
            async with grpc.aio.insecure_channel(gw.address) as channel:
                stub = policies_pb2_grpc.PoliciesStub(channel)
                with pytest.raises(grpc.aio.AioRpcError, match="without --model-repository"):
                    await publish(stub, {"w": torch.zeros(1)}, probe_outputs=np.zeros((4, 3), np.float32))

    asyncio.run(scenario())
