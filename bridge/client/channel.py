"""gRPC channels to a gateway, with TLS, mTLS and a token: built here and nowhere else.

    creds = Credentials(ca=Path("certs/ca.crt"), cert=Path("certs/robot.crt"), key=Path("certs/robot.key"),
                        token=os.environ.get("TETHER_TOKEN"))
    channel = aio_channel("gw.lab:50051", creds)          # grpc.aio; sync_channel(...) for blocking code

Without `ca` the channel is plaintext. The token goes as `authorization: Bearer NAME.SECRET` on every
call: as call credentials over TLS; over plaintext only to a loopback gateway (127.0.0.0/8, ::1,
localhost, a unix socket), since anywhere else it would be handed to the network:

    >>> Credentials(token="robot.s3cret").check("127.0.0.1:50051")
    >>> Credentials(token="robot.s3cret").check("gw.lab:50051")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: refusing to send a token in plaintext to 'gw.lab:50051' (not a loopback address; ...): give --tls-ca
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bridge.common.net import is_loopback

__all__ = ["Credentials", "aio_channel", "is_loopback", "is_loopback_address", "sync_channel"]


def is_loopback_address(address: str) -> bool:
    """Whether a gRPC target HOST:PORT (or unix:PATH) stays on this machine."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    host, sep, port = address.rpartition(":")
    return is_loopback(host if sep and port.isdigit() else address)


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """TLS (`ca`: the CA of the gateway's certificate; `cert` + `key`: this client's certificate, mTLS)
    and a token NAME.SECRET (`tether token add NAME --role ...`). All None: plaintext, no token."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    token: str | None = field(default=None, repr=False)

    def check(self, address: str) -> None:
        """ValueError naming what is wrong: half a client certificate, one without a CA, a token in plaintext
        to anything but loopback."""
        if (self.cert is None) != (self.key is None):
            raise ValueError(f"a client certificate needs both --tls-cert and --tls-key (got cert={self.cert}, "
                             f"key={self.key})")
        if self.ca is None and self.cert is not None:
            raise ValueError("a client certificate needs --tls-ca (the CA that signed the gateway's certificate)")
        if self.token is not None and (not isinstance(self.token, str) or not self.token.isprintable()):
            raise ValueError("token: expected a printable NAME.SECRET")
        if self.token and self.ca is None and not is_loopback_address(address):
            raise ValueError(f"refusing to send a token in plaintext to {address!r} (not a loopback address; "
                             f"a token is sent only over TLS or to loopback): give --tls-ca")

    @property
    def tls(self) -> bool:
        return self.ca is not None

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS credentials with the token as call credentials; None for plaintext (the token then travels by
        interceptor, see `metadata`)."""
        if self.ca is None:
            return None
        creds = grpc.ssl_channel_credentials(root_certificates=Path(self.ca).read_bytes(),
                                             private_key=Path(self.key).read_bytes() if self.key else None,
                                             certificate_chain=Path(self.cert).read_bytes() if self.cert else None)
        if self.token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(self.token))
        return creds

    def metadata(self) -> tuple[tuple[str, str], ...] | None:
        """The token as call metadata, for a plaintext (loopback) channel; None over TLS or without a token."""
        return (("authorization", f"Bearer {self.token}"),) if self.token and self.ca is None else None


def aio_channel(address: str, credentials: Credentials | None = None, *,
                options: Sequence[tuple[str, object]] = ()) -> grpc.aio.Channel:
    """A `grpc.aio` channel to `address` (HOST:PORT) with `credentials` checked (`Credentials.check`)."""
    credentials = credentials or Credentials()
    credentials.check(address)
    creds = credentials.channel_credentials()
    if creds is not None:
        return grpc.aio.secure_channel(address, creds, options=list(options))
    metadata = credentials.metadata()
    interceptors = [kind(metadata) for kind in _AIO_INTERCEPTORS] if metadata else None
    return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)


def sync_channel(address: str, credentials: Credentials | None = None, *,
                 options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
    """As `aio_channel`, a blocking `grpc.Channel`."""
    credentials = credentials or Credentials()
    credentials.check(address)
    creds = credentials.channel_credentials()
    if creds is not None:
        return grpc.secure_channel(address, creds, options=list(options))
    channel = grpc.insecure_channel(address, options=list(options))
    metadata = credentials.metadata()
    return grpc.intercept_channel(channel, _SyncMetadata(metadata)) if metadata else channel


class _AioMetadata:
    """Adds metadata to every call (grpc.aio files an interceptor under one call type only: one class per type)."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]):
        self._metadata = metadata

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(tuple(d.metadata) if d.metadata else ()), *self._metadata)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)


class _AioUnaryUnary(_AioMetadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _AioUnaryStream(_AioMetadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):
        return await continuation(self._details(client_call_details), request)


class _AioStreamUnary(_AioMetadata, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


class _AioStreamStream(_AioMetadata, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return await continuation(self._details(client_call_details), request_iterator)


_AIO_INTERCEPTORS = (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")), grpc.ClientCallDetails):
    pass


class _SyncMetadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                    grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, metadata: tuple[tuple[str, str], ...]):
        self._metadata = metadata

    def _details(self, d):
        return _Details(d.method, d.timeout, [*(d.metadata or ()), *self._metadata], d.credentials,
                        getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)
