"""The trainer's gRPC channel to the gateway: plaintext on loopback, or TLS (mTLS) plus a token.

    channel = gateway_channel("gw.lab:50051", options=[...])   # grpc.Channel (synchronous)

`tether train --tls-ca CA [--tls-cert CERT --tls-key KEY] [--token NAME.SECRET]` puts these in the
environment (`TETHER_TLS_CA`, `TETHER_TLS_CERT`, `TETHER_TLS_KEY`, `TETHER_TOKEN`), so every rank
under torchrun connects the same way without secrets on its command line. The channel itself is
`bridge.client.channel`'s: a token travels only over TLS, or in the clear to a loopback gateway:

    >>> gateway_channel("127.0.0.1:1", env={"TETHER_TOKEN": "ci.s3cret"}).close()
    >>> gateway_channel("gw.lab:1", env={"TETHER_TOKEN": "ci.s3cret"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: refusing to send a token in plaintext to 'gw.lab:1' (not a loopback address; ...): give --tls-ca
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc

from bridge.client.channel import Credentials, sync_channel

ENV = {"tls_ca": "TETHER_TLS_CA", "tls_cert": "TETHER_TLS_CERT", "tls_key": "TETHER_TLS_KEY", "token": "TETHER_TOKEN"}


def gateway_channel(address: str, *, options: Sequence[tuple[str, object]] = (),
                    env: Mapping[str, str] | None = None) -> grpc.Channel:
    env = os.environ if env is None else env
    ca, cert, key, token = (env.get(ENV[k]) or None for k in ("tls_ca", "tls_cert", "tls_key", "token"))
    credentials = Credentials(ca=Path(ca) if ca else None, cert=Path(cert) if cert else None,
                              key=Path(key) if key else None, token=token)
    return sync_channel(address, credentials, options=options)
