"""gRPC channels to a gateway, with TLS, mTLS and a token: built here and nowhere else.

    creds = Credentials.from_args(args)     # --tls-ca/--tls-cert/--tls-key/--token (bridge.common.flags)
    creds = Credentials.from_env()          # $TETHER_TLS_CA, $TETHER_TLS_CERT, $TETHER_TLS_KEY, $TETHER_TOKEN
    channel = aio_channel("gw.lab:50051", creds)          # grpc.aio; sync_channel(...) for blocking code

A service's client (`ServiceClient`: `PoliciesClient`, `FleetClient`, `ExperienceClient`) owns such a
channel with its stub; `Credentials.env()` hands the same credentials to child processes (`tether train`'s
ranks), off their command lines.

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
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import grpc

from bridge.common.lifecycle import Closing
from bridge.common.net import is_loopback

__all__ = ["CREDENTIALS_ENV", "Credentials", "ServiceClient", "aio_channel", "is_loopback", "is_loopback_address",
           "sync_channel"]

# field -> the environment variable `Credentials.from_env` reads it from
CREDENTIALS_ENV = {"ca": "TETHER_TLS_CA", "cert": "TETHER_TLS_CERT", "key": "TETHER_TLS_KEY", "token": "TETHER_TOKEN"}


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

    @classmethod
    def from_args(cls, args) -> Credentials:
        """From a command's --tls-ca/--tls-cert/--tls-key/--token (`bridge.common.flags.credential_flags`)."""
        return cls(ca=_path(args.tls_ca), cert=_path(args.tls_cert), key=_path(args.tls_key),
                   token=getattr(args, "token", None) or None)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials:
        """From `CREDENTIALS_ENV`'s variables (default: os.environ); unset or empty ones are not given.

        >>> Credentials.from_env({"TETHER_TLS_CA": "ca.crt", "TETHER_TOKEN": ""})
        Credentials(ca=PosixPath('ca.crt'), cert=None, key=None)
        """
        env = os.environ if env is None else env
        ca, cert, key, token = (env.get(CREDENTIALS_ENV[k]) or None for k in ("ca", "cert", "key", "token"))
        return cls(ca=_path(ca), cert=_path(cert), key=_path(key), token=token)

    def env(self) -> dict[str, str]:
        """The variables `from_env` reads these credentials back from (the ones given).

        >>> Credentials(ca=Path("ca.crt"), token="ci.s3cret").env()
        {'TETHER_TLS_CA': 'ca.crt', 'TETHER_TOKEN': 'ci.s3cret'}
        """
        values = {"ca": self.ca, "cert": self.cert, "key": self.key, "token": self.token}
        return {CREDENTIALS_ENV[k]: str(v) for k, v in values.items() if v}

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


def _path(value: str | Path | None) -> Path | None:
    return Path(value) if value else None


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


class ServiceClient(Closing):
    """A client of one `tether.v1` service: its stub (`STUB`) on a channel of its own, blocking, or grpc.aio
    with `aio=True` (then each call returns an awaitable and `async with` closes it), closed with the client.

        with FleetClient("gw.lab:50051", Credentials.from_args(args)) as fleet:
            fleet.status()
        async with FleetClient(gw.address, aio=True) as fleet:
            await fleet.status()

    `timeout_s`: every call's deadline (None: none); `operator`: the name sent as `x-tether-operator` (the
    audit log's, on a gateway with open access; empty: not sent).
    """

    STUB: ClassVar[Callable[[Any], Any]]
    OPTIONS: ClassVar[tuple[tuple[str, object], ...]] = ()

    def __init__(self, address: str, credentials: Credentials | None = None, *, aio: bool = False,
                 timeout_s: float | None = 60.0, operator: str = "", options: Sequence[tuple[str, object]] = ()):
        if not address or ":" not in address:
            raise ValueError(f"gateway address {address!r} must be HOST:PORT")
        self.address, self.aio, self.timeout_s = address, aio, timeout_s
        self.metadata = (("x-tether-operator", operator),) if operator else ()
        self.channel = (aio_channel if aio else sync_channel)(address, credentials, options=[*self.OPTIONS, *options])
        self.stub = self.STUB(self.channel)

    def _call(self, method: str, request, **kw):
        """One call of the stub with this client's deadline and metadata (an awaitable when `aio`)."""
        return getattr(self.stub, method)(request, timeout=self.timeout_s, metadata=self.metadata or None, **kw)

    def close(self):
        """Close the channel (a coroutine when `aio`)."""
        return self.channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class _AioMetadata:
    """Adds metadata to every call (grpc.aio files an interceptor under one call type only: one class per type)."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]):
        self._metadata = metadata

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(tuple(d.metadata) if d.metadata else ()), *self._metadata)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)

    async def _intercept(self, continuation, client_call_details, request):  # a request or a request iterator
        return await continuation(self._details(client_call_details), request)


class _AioUnaryUnary(_AioMetadata, grpc.aio.UnaryUnaryClientInterceptor):
    intercept_unary_unary = _AioMetadata._intercept


class _AioUnaryStream(_AioMetadata, grpc.aio.UnaryStreamClientInterceptor):
    intercept_unary_stream = _AioMetadata._intercept


class _AioStreamUnary(_AioMetadata, grpc.aio.StreamUnaryClientInterceptor):
    intercept_stream_unary = _AioMetadata._intercept


class _AioStreamStream(_AioMetadata, grpc.aio.StreamStreamClientInterceptor):
    intercept_stream_stream = _AioMetadata._intercept


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

    def _intercept(self, continuation, client_call_details, request):  # a request or a request iterator
        return continuation(self._details(client_call_details), request)

    intercept_unary_unary = intercept_unary_stream = intercept_stream_unary = intercept_stream_stream = _intercept
