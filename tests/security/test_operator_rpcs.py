"""Operator RPCs on a real gateway (real Triton): tether.v1.Policies.Pin needs the operator role
(a token or a client certificate with OU=operator); reading the rollout is open to viewers; Publish
needs the trainer role. The audit trail names who acted."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bridge.client import Credentials, aio_channel
from bridge.security.tokens import TokenStore
from protos import policies_pb2, policies_pb2_grpc
from tests.security.helpers import client_files, make_certs
from tests.support.gateways import running_gateway

OK, UNAUTH, DENIED = grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED


async def pin(channel, selector: str) -> tuple[grpc.StatusCode, policies_pb2.RolloutStatusReply | str]:
    try:
        reply = await policies_pb2_grpc.PoliciesStub(channel).Pin(
            policies_pb2.PinRequest(policy="tiny", selector=selector, version=1, why="test"), timeout=60)
        return OK, reply
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details()


async def publish_header_only(channel) -> grpc.StatusCode:
    async def chunks():
        yield policies_pb2.PublishChunk(header=policies_pb2.PublishHeader(policy="tiny", size=0))

    try:
        await policies_pb2_grpc.PoliciesStub(channel).Publish(chunks(), timeout=60)
        return OK
    except grpc.aio.AioRpcError as exc:
        return exc.code()


def test_tokens_guard_operator_rpcs_on_loopback(triton, tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    alice, bob = store.add("alice", role="operator"), store.add("bob", role="viewer")

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", tokens=tmp_path / "tokens.json") as gw:
            async with aio_channel(gw.address) as anonymous, \
                       aio_channel(gw.address, Credentials(token=bob)) as viewer, \
                       aio_channel(gw.address, Credentials(token=alice)) as operator:
                code, details = await pin(anonymous, "robot=arm_9")
                assert code == UNAUTH and "tether token add" in details
                code, details = await pin(viewer, "robot=arm_9")
                assert code == DENIED and "viewer:bob" in details
                code, reply = await pin(operator, "robot=arm_9")
                assert code == OK, reply
                assert reply.events[-1].who == "operator:alice" and reply.events[-1].kind == "pin"
                status = await policies_pb2_grpc.PoliciesStub(anonymous).RolloutStatus(
                    policies_pb2.RolloutStatusRequest(policy="tiny"), timeout=60)   # viewing: anonymous is fine
                assert any(e.who == "operator:alice" for e in status.events)
                assert await publish_header_only(anonymous) == UNAUTH              # publishing needs "trainer"
                assert await publish_header_only(viewer) == DENIED
                assert await publish_header_only(operator) not in (UNAUTH, DENIED)  # past auth (then refused)

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_a_client_certificate_with_the_operator_role_acts(triton, certs):
    tls = {"tls_cert": certs / "server.crt", "tls_key": certs / "server.key", "tls_client_ca": certs / "ca.crt"}

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", **tls) as gw:
            async with aio_channel(gw.address, Credentials(**client_files(certs, "arm_1"))) as robot, \
                       aio_channel(gw.address, Credentials(**client_files(certs, "alice"))) as operator:
                code, details = await pin(robot, "robot=arm_1")
                assert code == DENIED and "robot:arm_1 may not act as operator" in details
                code, reply = await pin(operator, "robot=arm_1")
                assert code == OK and reply.events[-1].who == "operator:alice"

    asyncio.run(scenario())
