"""The fleet's admin step, run once per install or upgrade (the Job tether-prepare in deploy/kubernetes/admin.yaml):
as the PostgreSQL admin, the gateways' least-privilege role, the registry's schema and its grants
(`bridge.registry.roles.prepare`); as the NATS admin, the experience stream (no client role may create it).

    python deploy/prepare.py \
        --registry 'postgresql://tether@tether-postgres:5432/tether?sslmode=verify-full&sslrootcert=/run/tether/ca.crt'\
        --registry-passfile /run/tether/admin.pgpass --gateway-passfile /run/tether/gateway.pgpass \
        --experience tls://tether-nats-0.tether-nats:4222,... \
        --nats-user admin --nats-password-file /run/tether/nats.password --nats-ca /run/tether/ca.crt

Idempotent: the role's password is reset to the gateway passfile's, missing migrations applied, the stream
checked (and its message size raised) when it exists. Passwords are read from files only; a failure exits
naming what failed, never a secret.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    from bridge.experience.jetstream import add_nats_arguments

    p = argparse.ArgumentParser(prog="python deploy/prepare.py", description="The fleet's admin step: the "
                                "registry's gateway role, schema and grants; the experience stream.")
    p.add_argument("--registry", required=True, metavar="postgresql://ADMIN@HOST:PORT/DB?sslmode=verify-full&...",
                   help="the registry as its admin (no password in the URL)")
    p.add_argument("--registry-passfile", type=Path, required=True, help="the admin's libpq passfile (0600)")
    p.add_argument("--gateway-passfile", type=Path, required=True,
                   help="the gateways' libpq passfile: its user is the role made, its password the role's")
    p.add_argument("--experience", required=True, metavar="tls://HOST:PORT[,...]", help="the NATS servers")
    add_nats_arguments(p)
    p.add_argument("--replicas", type=int, default=3, help="the experience stream's replicas")
    p.add_argument("--timeout-s", type=float, default=120.0, help="how long to wait for the stream's cluster")
    return p


def main(argv: list[str] | None = None) -> int:
    from bridge.experience.jetstream import connect, ensure_stream, nats_auth_from, parse_servers
    from bridge.registry.backends import with_passfile
    from bridge.registry.roles import prepare

    a = parser().parse_args(argv)
    try:
        prepare(with_passfile(a.registry, a.registry_passfile), gateway_passfile=a.gateway_passfile)
        print("registry: the gateway role, schema and grants are in place", flush=True)
        servers, auth = parse_servers(a.experience), nats_auth_from(a)

        async def stream() -> None:
            nc = await connect(servers, name="tether-prepare", auth=auth)
            try:
                await ensure_stream(nc.jetstream(timeout=10.0), replicas=a.replicas, timeout_s=a.timeout_s)
            finally:
                await nc.close()

        asyncio.run(stream())
        print("experience: the stream is in place", flush=True)
    except Exception as exc:  # noqa: BLE001 - the registry's and the stream's errors name what failed, not secrets
        raise SystemExit(f"deploy/prepare.py: {exc}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
