"""A trainer reaches a gateway that wants credentials: TLS with the lab CA and a trainer token, set by
`tether train --tls-ca --token` for every rank (`Credentials.from_env`). Without the token it is refused;
a viewer may list versions but neither fetch weights nor read the experience stream."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from bridge.client import Credentials, ExperienceClient, PoliciesClient
from bridge.security.tokens import TokenStore
from protos import experience_pb2
from tests.security.helpers import make_certs
from tests.support.gateways import running_gateway


def subscribe_once(address: str) -> str:
    """Open Experience.Subscribe through the trainer's channel: the gateway's verdict on the caller."""
    with ExperienceClient(address, Credentials.from_env(), timeout_s=30) as client:
        call = client.subscribe(iter([experience_pb2.SubscribeRequest(start=experience_pb2.SubscribeStart())]))
        metadata = dict(call.initial_metadata())  # sent once the caller is authorized; a refusal ends the call
        if "tether-subscriber" not in metadata:
            raise next(call)  # the refusal, as the RpcError that reading raises (never a value here)
        call.cancel()
        return metadata["tether-subscriber"]


def test_trainer_channel_needs_tls_and_a_trainer_token(triton, tmp_path, monkeypatch):
    certs = make_certs(tmp_path / "certs")
    store = TokenStore(tmp_path / "tokens.json")
    trainer, viewer = store.add("ci", role="trainer"), store.add("eve", role="viewer")
    monkeypatch.setenv("TETHER_TLS_CA", str(certs / "ca.crt"))

    def as_(token: str | None, call):
        if token is None:
            monkeypatch.delenv("TETHER_TOKEN", raising=False)
        else:
            monkeypatch.setenv("TETHER_TOKEN", token)
        try:
            return call()
        except grpc.RpcError as exc:
            return exc.code()

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", tls_cert=certs / "server.crt",
                                   tls_key=certs / "server.key", tokens=tmp_path / "tokens.json",
                                   anonymous_viewers=False, experience_dir=tmp_path / "experience",
                                   model_repository=triton.repo.root, registry=tmp_path / "registry.sqlite") as gw:
            def calls():  # each client made under the environment `as_` sets, as a rank would be
                def client():
                    return PoliciesClient(gw.address, Credentials.from_env(), timeout_s=30)
                return {
                    "list": as_(trainer, lambda: client().list().policy),
                    "fetch": as_(trainer, lambda: client().fetch().version),
                    "subscribe": as_(trainer, lambda: subscribe_once(gw.address)),
                    "list without token": as_(None, lambda: client().list()),
                    "subscribe without token": as_(None, lambda: subscribe_once(gw.address)),
                    "viewer list": as_(viewer, lambda: client().list().policy),
                    "viewer fetch": as_(viewer, lambda: client().fetch()),
                    "viewer subscribe": as_(viewer, lambda: subscribe_once(gw.address)),
                }
            return await asyncio.to_thread(calls)

    got = asyncio.run(scenario())
    assert (got["list"], got["fetch"], got["subscribe"]) == ("tiny", 1, "authorized"), got
    assert got["list without token"] == grpc.StatusCode.UNAUTHENTICATED
    assert got["subscribe without token"] == grpc.StatusCode.UNAUTHENTICATED
    assert got["viewer list"] == "tiny"
    assert got["viewer fetch"] == grpc.StatusCode.PERMISSION_DENIED
    assert got["viewer subscribe"] == grpc.StatusCode.PERMISSION_DENIED


def test_a_token_is_never_sent_in_the_clear_off_loopback(monkeypatch):
    monkeypatch.delenv("TETHER_TLS_CA", raising=False)
    monkeypatch.setenv("TETHER_TOKEN", "ci.secret")
    with pytest.raises(ValueError, match="only over TLS"):
        PoliciesClient("10.1.2.3:50051", Credentials.from_env())
