"""The console over HTTPS with the gateway's certificate (`tether certs init`): client certificates are
identities as on gRPC (an operator's acts, a viewer's is refused with 403, none gets 401), reads stay open
to anonymous viewers, and plaintext HTTP gets no answer."""

from __future__ import annotations

import asyncio
import ssl

import aiohttp
import pytest

from tests.support.gateways import running_gateway

certs_module = pytest.importorskip("bridge.security.certs", reason="bridge.security has no certificates yet")


def client_context(certs, name: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs["ca.crt"]))
    if name is not None:
        ctx.load_cert_chain(certs[f"{name}.crt"], certs[f"{name}.key"])
    return ctx


def test_console_https_with_client_certificates(triton, tmp_path):
    certs = certs_module.init_certs(tmp_path / "certs", clients=[("alice", "operator"), ("bob", "viewer")])

    async def post(url: str, ctx: ssl.SSLContext) -> tuple[int, dict]:
        async with aiohttp.ClientSession() as http, http.post(
                url + "api/estop", json={"target": {"robot": "arm_1"}, "why": "test"}, ssl=ctx,
                headers={"X-Tether-Console": "1"}) as reply:  # what the console page sends with every action
            return reply.status, await reply.json()

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", console_port=0, tls_cert=certs["server.crt"],
                                   tls_key=certs["server.key"], tls_client_ca=certs["ca.crt"]) as gw:
            url = gw.console.url
            assert url.startswith("https://127.0.0.1:")
            async with aiohttp.ClientSession() as http, http.get(url + "api/state",
                                                                 ssl=client_context(certs, None)) as reply:
                assert reply.status == 200 and "sessions" in await reply.json()
            status, body = await post(url, client_context(certs, None))
            assert status == 401 and not gw.fleet.estops, body
            status, body = await post(url, client_context(certs, "bob"))
            assert status == 403 and not gw.fleet.estops, body
            status, body = await post(url, client_context(certs, "alice"))
            assert status == 200 and body["who"] == "operator:alice" and "robot=arm_1" in gw.fleet.estops, body
            with pytest.raises(aiohttp.ClientError):
                async with aiohttp.ClientSession() as http:
                    async with http.get(url.replace("https", "http") + "api/state") as reply:
                        await reply.read()

    asyncio.run(scenario())
