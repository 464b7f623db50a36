"""Client channels to the gateway with the caller's TLS settings and token (for `tether` CLIs).

    channel = secure_channel("gw.lab:50051", ca=Path("certs/ca.crt"), cert=Path("certs/alice.crt"),
                             key=Path("certs/alice.key"), token=os.environ.get("TETHER_TOKEN"))
    stub = policies_pb2_grpc.PoliciesStub(channel)        # grpc.aio; secure_channel_sync for blocking code

Without `ca` the channel is plaintext. A token is sent as `authorization: Bearer NAME.SECRET` on
every call: as call credentials over TLS; in plaintext only to a loopback address (elsewhere that
would hand it to anyone on the network: a ValueError says so). `add_client_args(parser)` adds
--tls-ca/--tls-cert/--tls-key/--token (token default: $TETHER_TOKEN) and `channel_kwargs(args)`
turns them into these keywords.
"""

from __future__ import annotations

import argparse
import collections
import os
from collections.abc import Sequence
from pathlib import Path

import grpc

from bridge.security.tls import is_loopback

TOKEN_ENV = "TETHER_TOKEN"


def _credentials(address: str, ca: Path | None, cert: Path | None, key: Path | None,
                 token: str | None) -> tuple[grpc.ChannelCredentials | None, str | None]:
    """(channel credentials or None for plaintext, the token to attach by interceptor or None)."""
    if (cert is None) != (key is None):
        raise ValueError(f"a client certificate needs both --tls-cert and --tls-key (got cert={cert}, key={key})")
    if ca is None:
        if cert is not None:
            raise ValueError("a client certificate needs --tls-ca (the CA that signed the gateway's certificate)")
        if token and not is_loopback(address.rpartition(":")[0] or address):
            raise ValueError(f"refusing to send a token in plaintext to {address}: give --tls-ca")
        return None, token or None
    creds = grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes(),
                                         private_key=Path(key).read_bytes() if key else None,
                                         certificate_chain=Path(cert).read_bytes() if cert else None)
    if token:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return creds, None


def secure_channel(address: str, *, ca: Path | None = None, cert: Path | None = None, key: Path | None = None,
                   token: str | None = None, options: Sequence[tuple[str, object]] = ()) -> grpc.aio.Channel:
    """A `grpc.aio` channel: TLS when `ca` is given (mTLS with `cert` + `key`), the token on every call."""
    creds, plain_token = _credentials(address, ca, cert, key, token)
    interceptors = _aio_token_interceptors(plain_token) if plain_token else None
    if creds is None:
        return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)
    return grpc.aio.secure_channel(address, creds, options=list(options))


def secure_channel_sync(address: str, *, ca: Path | None = None, cert: Path | None = None,
                        key: Path | None = None, token: str | None = None,
                        options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
    """As `secure_channel`, a blocking `grpc.Channel`."""
    creds, plain_token = _credentials(address, ca, cert, key, token)
    if creds is not None:
        return grpc.secure_channel(address, creds, options=list(options))
    channel = grpc.insecure_channel(address, options=list(options))
    return grpc.intercept_channel(channel, _SyncToken(plain_token)) if plain_token else channel


def add_client_args(parser: argparse.ArgumentParser, *, token: bool = True) -> None:
    g = parser.add_argument_group("gateway TLS and credentials")
    g.add_argument("--tls-ca", type=Path, help="CA certificate to verify the gateway with (turns TLS on)")
    g.add_argument("--tls-cert", type=Path, help="client certificate (mTLS; with --tls-key)")
    g.add_argument("--tls-key", type=Path, help="client private key")
    if token:
        g.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                       help=f"operator/trainer token NAME.SECRET (default: ${TOKEN_ENV})")


def channel_kwargs(args: argparse.Namespace) -> dict:
    return {"ca": args.tls_ca, "cert": args.tls_cert, "key": args.tls_key, "token": getattr(args, "token", None)}


class _AioToken:
    """Adds the token to a call's metadata (grpc.aio files an interceptor under one call type only:
    `_aio_token_interceptors` makes one per type)."""

    def __init__(self, token: str):
        self._pair = ("authorization", f"Bearer {token}")

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(tuple(d.metadata) if d.metadata else ()), self._pair)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)


class _AioUnaryUnary(_AioToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _AioUnaryStream(_AioToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _AioStreamUnary(_AioToken, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


class _AioStreamStream(_AioToken, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


def _aio_token_interceptors(token: str) -> list:
    return [kind(token) for kind in (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)]


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")), grpc.ClientCallDetails):
    pass


class _SyncToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                 grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str):
        self._pair = ("authorization", f"Bearer {token}")

    def _details(self, d):
        return _Details(d.method, d.timeout, [*(d.metadata or ()), self._pair], d.credentials,
                        getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)
