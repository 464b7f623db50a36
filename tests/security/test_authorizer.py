"""`Authorizer.require` behind a real gRPC server: tokens (plaintext loopback and TLS), client
certificates (mTLS), roles, open access; and `require_http` for the console."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bridge.client import Credentials, aio_channel
from bridge.gateway.errors import PermissionDenied, Unauthenticated
from bridge.security import Authorizer
from bridge.security.tls import TlsFiles
from bridge.security.tokens import TokenStore
from tests.security.helpers import ask, client_files, make_certs, probe_server

OK, UNAUTH, DENIED = grpc.StatusCode.OK, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_tokens_over_loopback_plaintext(tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    alice, bob = store.add("alice", role="operator"), store.add("bob", role="viewer")
    trainer = store.add("ci", role="trainer")

    async def scenario():
        async with probe_server(Authorizer(tokens=store)) as address:
            async def who(token, role):
                async with aio_channel(address, Credentials(token=token)) as channel:
                    return await ask(channel, role)

            assert await who(alice, "operator") == (OK, "operator:alice")
            assert await who(alice, "viewer") == (OK, "operator:alice")
            assert await who(trainer, "trainer") == (OK, "trainer:ci")
            assert await who(None, "viewer") == (OK, "viewer:anonymous")        # anonymous viewing allowed
            code, details = await who(None, "operator")
            assert code == UNAUTH and "tether token add" in details
            code, details = await who(bob, "operator")
            assert code == DENIED and "viewer:bob may not act as operator" in details
            assert (await who(trainer, "operator"))[0] == DENIED
            assert (await who(alice[:-2] + "xx", "operator"))[0] == UNAUTH     # a mistyped secret
            assert (await who(alice[:-2] + "xx", "viewer"))[0] == UNAUTH       # a bad token is never ignored
            store.revoke("alice")
            assert (await who(alice, "operator"))[0] == UNAUTH

    asyncio.run(scenario())


def test_client_certificates_and_tokens_over_mtls(certs, tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    carol = store.add("carol", role="operator")
    tls = TlsFiles(cert=certs / "server.crt", key=certs / "server.key", client_ca=certs / "ca.crt")
    auth = Authorizer(tokens=store, client_certs=True, anonymous_viewers=False)

    async def scenario():
        async with probe_server(auth, tls=tls) as address:
            async def who(name, role, token=None):
                async with aio_channel(address, Credentials(token=token, **client_files(certs, name))) as channel:
                    return await ask(channel, role)

            assert await who("alice", "operator") == (OK, "operator:alice")
            assert await who("arm_1", "robot") == (OK, "robot:arm_1")
            code, details = await who("arm_1", "operator")
            assert code == DENIED and "robot:arm_1 may not act as operator" in details
            assert (await who("bob", "viewer")) == (OK, "viewer:bob")
            assert (await who("bob", "operator"))[0] == DENIED
            assert await who("arm_1", "operator", token=carol) == (OK, "operator:carol")  # token over TLS
            code, _ = await who(None, "viewer")                 # no client certificate: the handshake fails
            assert code == grpc.StatusCode.UNAVAILABLE

    asyncio.run(scenario())


def test_a_certificate_from_another_ca_is_refused(certs, tmp_path):
    other = make_certs(tmp_path / "other")
    tls = TlsFiles(cert=certs / "server.crt", key=certs / "server.key", client_ca=certs / "ca.crt")

    async def scenario():
        async with probe_server(Authorizer(client_certs=True), tls=tls) as address:
            files = {"ca": certs / "ca.crt", "cert": other / "alice.crt", "key": other / "alice.key"}
            async with aio_channel(address, Credentials(**files)) as channel:
                assert (await ask(channel, "operator"))[0] == grpc.StatusCode.UNAVAILABLE
            async with aio_channel(address, Credentials(**client_files(other, "alice"))) as channel:  # the wrong CA
                assert (await ask(channel, "viewer"))[0] == grpc.StatusCode.UNAVAILABLE

    asyncio.run(scenario())


def test_open_access_and_exposed_without_credentials():
    async def scenario():
        async with probe_server(Authorizer()) as address:
            async with aio_channel(address) as channel:
                assert await ask(channel, "operator") == (OK, "operator:anonymous")
            async with grpc.aio.insecure_channel(address) as channel:
                reply = await channel.unary_unary("/probe.Probe/Who")(b"operator", metadata=(
                    ("x-tether-operator", "dana"),))
                assert reply == b"operator:dana"
                reply = await channel.unary_unary("/probe.Probe/Who")(b"operator", metadata=(
                    ("x-tether-operator", "root <script>" + "x" * 100),))       # not a name: not in the audit log
                assert reply == b"operator:anonymous"
        async with probe_server(Authorizer(open_access=False)) as address:  # exposed, nothing configured
            async with aio_channel(address) as channel:
                code, details = await ask(channel, "operator")
                assert code == DENIED and "--tokens" in details
                assert await ask(channel, "viewer") == (OK, "viewer:anonymous")

    asyncio.run(scenario())


def test_require_http(tmp_path):
    store = TokenStore(tmp_path / "tokens.json")
    alice = store.add("alice", role="operator")
    auth = Authorizer(tokens=store, client_certs=True)
    assert auth.require_http({"Authorization": f"Bearer {alice}"}, "operator") == "operator:alice"
    assert auth.require_http({}, "viewer") == "viewer:anonymous"
    with pytest.raises(Unauthenticated):
        auth.require_http({}, "operator")
    with pytest.raises(Unauthenticated):
        auth.require_http({"authorization": "Bearer alice.nope"}, "viewer")
    peer = {"subject": ((("organizationalUnitName", "viewer"),), (("commonName", "bob"),))}
    assert auth.require_http({}, "viewer", peer_cert=peer) == "viewer:bob"
    with pytest.raises(PermissionDenied, match="viewer:bob"):
        auth.require_http({}, "operator", peer_cert=peer)
    with pytest.raises(ValueError, match="'root'"):
        auth.require_http({}, "root")


def test_a_token_is_not_sent_in_plaintext_off_loopback():
    with pytest.raises(ValueError, match="plaintext"):
        aio_channel("192.0.2.7:50051", Credentials(token="alice.secret"))
    with pytest.raises(ValueError, match="--tls-key"):
        aio_channel("127.0.0.1:50051", Credentials(ca=None, cert="x.crt"))


def test_the_token_rides_on_every_kind_of_call_aio_and_blocking():
    from bridge.client import sync_channel

    async def scenario():
        seen: list[str | None] = []

        def token(context) -> None:
            seen.append(dict(context.invocation_metadata()).get("authorization"))

        async def uu(request, context):
            token(context)
            return b"ok"

        async def us(request, context):
            token(context)
            yield b"ok"

        async def su(requests, context):
            token(context)
            async for _ in requests:
                pass
            return b"ok"

        async def ss(requests, context):
            token(context)
            async for r in requests:
                yield r

        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("p.P", {
            "UU": grpc.unary_unary_rpc_method_handler(uu), "US": grpc.unary_stream_rpc_method_handler(us),
            "SU": grpc.stream_unary_rpc_method_handler(su), "SS": grpc.stream_stream_rpc_method_handler(ss)})])
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        try:
            async with aio_channel(address, Credentials(token="ci.aio")) as ch:
                await ch.unary_unary("/p.P/UU")(b"x")
                assert [r async for r in ch.unary_stream("/p.P/US")(b"x")] == [b"ok"]
                await ch.stream_unary("/p.P/SU")(iter([b"a", b"b"]))
                assert [r async for r in ch.stream_stream("/p.P/SS")(iter([b"a"]))] == [b"a"]

            def blocking():
                with sync_channel(address, Credentials(token="ci.sync")) as ch:
                    ch.unary_unary("/p.P/UU")(b"x")
                    assert list(ch.unary_stream("/p.P/US")(b"x")) == [b"ok"]
                    ch.stream_unary("/p.P/SU")(iter([b"a"]))
                    assert list(ch.stream_stream("/p.P/SS")(iter([b"a"]))) == [b"a"]

            await asyncio.to_thread(blocking)
        finally:
            await server.stop(0)
        assert seen == ["Bearer ci.aio"] * 4 + ["Bearer ci.sync"] * 4

    asyncio.run(scenario())
