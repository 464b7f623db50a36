"""The one channel builder's loopback rule: a token goes in plaintext to loopback only, and it really
arrives there (a real grpc server on 127.0.0.1 reads the metadata)."""

from __future__ import annotations

import asyncio
import re
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from bridge.client import ExperienceClient, FleetClient, PoliciesClient
from bridge.client.channel import Credentials, aio_channel, is_loopback_address, sync_channel


@pytest.mark.parametrize("address", ["10.0.0.7:50051", "gw.lab:50051", "0.0.0.0:50051", "[2001:db8::1]:50051",
                                     "127.evil.example:50051", "localhost.evil.example:1"])
def test_a_token_in_plaintext_to_a_non_loopback_address_is_refused_by_every_builder(address):
    token = Credentials(token="robot_1.s3cret")
    for build in (lambda: aio_channel(address, token), lambda: sync_channel(address, token),
                  lambda: sync_channel(address, Credentials.from_env({"TETHER_TOKEN": "robot_1.s3cret"})),
                  lambda: PoliciesClient(address, token), lambda: FleetClient(address, token),
                  lambda: ExperienceClient(address, token, aio=True)):
        with pytest.raises(ValueError, match=re.escape(f"refusing to send a token in plaintext to {address!r}")):
            build()


@pytest.mark.parametrize("address", ["127.0.0.1:50051", "127.3.4.5:1", "localhost:50051", "[::1]:50051",
                                     "unix:/tmp/tether.sock"])
def test_a_token_in_plaintext_to_loopback_is_allowed(address):
    assert is_loopback_address(address)
    Credentials(token="robot_1.s3cret").check(address)
    sync_channel(address, Credentials(token="robot_1.s3cret")).close()


def test_without_a_token_plaintext_goes_anywhere_and_bad_certificates_are_named():
    sync_channel("10.0.0.7:50051").close()
    with pytest.raises(ValueError, match="both --tls-cert and --tls-key"):
        Credentials(ca=Path("ca.crt"), cert=Path("c.crt")).check("gw.lab:1")
    with pytest.raises(ValueError, match="needs --tls-ca"):
        Credentials(cert=Path("c.crt"), key=Path("c.key")).check("127.0.0.1:1")


def _echo_authorization_server() -> tuple[grpc.Server, str]:
    """A real grpc server on loopback whose one method returns the request's authorization header."""
    def echo(request: bytes, context) -> bytes:
        return dict(context.invocation_metadata()).get("authorization", "").encode()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler("t.Echo", {"Auth": grpc.unary_unary_rpc_method_handler(echo)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_the_token_arrives_as_bearer_on_a_loopback_channel_sync_and_aio():
    server, address = _echo_authorization_server()
    try:
        creds = Credentials(token="robot_1.s3cret")
        with sync_channel(address, creds) as channel:
            assert channel.unary_unary("/t.Echo/Auth")(b"", timeout=10) == b"Bearer robot_1.s3cret"

        async def aio() -> bytes:
            async with aio_channel(address, creds) as channel:
                return await channel.unary_unary("/t.Echo/Auth")(b"", timeout=10)

        assert asyncio.run(aio()) == b"Bearer robot_1.s3cret"
        with sync_channel(address) as channel:
            assert channel.unary_unary("/t.Echo/Auth")(b"", timeout=10) == b""
    finally:
        server.stop(None)
