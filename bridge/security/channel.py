"""Client channels for the `tether` CLIs, from their TLS and token flags (the channel itself is
`bridge.client.channel`'s, built there and nowhere else).

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
import os
from collections.abc import Sequence
from pathlib import Path

import grpc

from bridge.client.channel import Credentials, aio_channel, sync_channel

TOKEN_ENV = "TETHER_TOKEN"


def secure_channel(address: str, *, ca: Path | None = None, cert: Path | None = None, key: Path | None = None,
                   token: str | None = None, options: Sequence[tuple[str, object]] = ()) -> grpc.aio.Channel:
    """A `grpc.aio` channel: TLS when `ca` is given (mTLS with `cert` + `key`), the token on every call."""
    return aio_channel(address, Credentials(ca=ca, cert=cert, key=key, token=token or None), options=options)


def secure_channel_sync(address: str, *, ca: Path | None = None, cert: Path | None = None,
                        key: Path | None = None, token: str | None = None,
                        options: Sequence[tuple[str, object]] = ()) -> grpc.Channel:
    """As `secure_channel`, a blocking `grpc.Channel`."""
    return sync_channel(address, Credentials(ca=ca, cert=cert, key=key, token=token or None), options=options)


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
