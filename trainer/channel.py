"""The trainer's gRPC channel to the gateway: plaintext on loopback, or TLS (mTLS) plus a token.

    channel = gateway_channel("gw.lab:50051", options=[...])   # grpc.Channel (synchronous)

`tether train --tls-ca CA [--tls-cert CERT --tls-key KEY] [--token NAME.SECRET]` puts these in the
environment (`TETHER_TLS_CA`, `TETHER_TLS_CERT`, `TETHER_TLS_KEY`, `TETHER_TOKEN`), so every rank
under torchrun connects the same way without secrets on its command line. A token travels only
over TLS, or in the clear to a loopback gateway (grpc's local credentials):

    >>> gateway_channel("127.0.0.1:1", env={"TETHER_TOKEN": "ci.s3cret"}).close()
    >>> gateway_channel("gw.lab:1", env={"TETHER_TOKEN": "ci.s3cret"})
    Traceback (most recent call last):
    ...
    ValueError: a token is sent only over TLS or to a loopback gateway: give --tls-ca for 'gw.lab:1'
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

ENV = {"tls_ca": "TETHER_TLS_CA", "tls_cert": "TETHER_TLS_CERT", "tls_key": "TETHER_TLS_KEY", "token": "TETHER_TOKEN"}


def gateway_channel(address: str, *, options: Sequence[tuple[str, object]] = (),
                    env: Mapping[str, str] | None = None) -> grpc.Channel:
    env = os.environ if env is None else env
    ca, cert, key, token = (env.get(ENV[k]) or None for k in ("tls_ca", "tls_cert", "tls_key", "token"))
    if (cert is None) != (key is None):
        raise ValueError(f"a client certificate needs both --tls-cert and --tls-key, got {cert!r} and {key!r}")
    if ca is None:
        if cert is not None:
            raise ValueError("--tls-cert/--tls-key need --tls-ca (the CA that signed the gateway's certificate)")
        if token is None:
            return grpc.insecure_channel(address, options=list(options))
        if not _loopback(address):
            raise ValueError(f"a token is sent only over TLS or to a loopback gateway: give --tls-ca for {address!r}")
        transport = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    else:
        transport = grpc.ssl_channel_credentials(Path(ca).read_bytes(), Path(key).read_bytes() if key else None,
                                                 Path(cert).read_bytes() if cert else None)
    if token is not None:
        transport = grpc.composite_channel_credentials(transport, grpc.access_token_call_credentials(token))
    return grpc.secure_channel(address, transport, options=list(options))


def _loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
