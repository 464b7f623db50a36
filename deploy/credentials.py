"""The files deploy/kubernetes/kustomization.yaml's Secrets need beyond `tether cluster certs`' folder, made in it:

    tether cluster certs deploy/kubernetes/credentials --host tether-gateway-0.tether-gateway ...  (deploy/README.md)
    python deploy/credentials.py deploy/kubernetes/credentials
    kubectl apply -k deploy/kubernetes

It writes (each 0600, `bridge.security.tokens.write_private`; it prints only their paths):

    nats/route.password      the routes' shared secret (kept when it exists)
    nats/users.conf          what nats.yaml's nats.conf includes: the `authorization` block (every role's user,
                             its password bcrypt-hashed, its permissions: tether.cluster.nats.permissions, the
                             same as `tether cluster up`'s), the routes' hash and the route URLs carrying their secret
    postgres/admin.password  the admin's password alone (the postgres image's POSTGRES_PASSWORD_FILE)

In code: `make(Path("creds"))` returns the paths written; `nats_users_conf(...)` the text of users.conf.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["NATS_SERVERS", "make", "nats_users_conf"]

NATS_SERVERS = 3         # nats.yaml's StatefulSet replicas (tests/test_deploy.py holds them equal)
NATS_SERVICE = "tether-nats"
_BCRYPT_COST = 11


def _bcrypt(secret: str, cost: int) -> str:
    import bcrypt

    return bcrypt.hashpw(secret.encode(), bcrypt.gensalt(cost, prefix=b"2a")).decode()


def nats_users_conf(passwords: Mapping[str, str], route_secret: str, *, servers: int = NATS_SERVERS,
                    cost: int = _BCRYPT_COST) -> str:
    """users.conf for `passwords` (role -> plaintext) and the routes' secret ([A-Za-z0-9_-]: it goes into URLs)."""
    from tether.cluster.nats import permissions

    if not route_secret or not all(c.isalnum() or c in "-_" for c in route_secret):
        raise ValueError("the NATS route secret must be [A-Za-z0-9_-] (it goes into the route URLs)")
    users = [{"user": role, "password": _bcrypt(password, cost), "permissions": permissions(role)}
             for role, password in passwords.items()]
    lines = ["# deploy/credentials.py: the NATS users (bcrypt hashes, permissions) and the routes' credentials;",
             "# included by nats.yaml's nats.conf. A Secret: it holds the route secret in clear.",
             f"authorization {{\n  timeout: 2\n  users: {json.dumps(users, indent=2)}\n}}",
             f"route_password: {json.dumps(_bcrypt(route_secret, cost))}"]
    lines += [f"route_{i}: " + json.dumps(f"nats-route://route:{route_secret}@{NATS_SERVICE}-{i}.{NATS_SERVICE}:6222")
              for i in range(servers)]
    return "\n".join(lines) + "\n"


def make(folder: Path, *, cost: int = _BCRYPT_COST) -> list[Path]:
    """Write nats/route.password (when absent), nats/users.conf and postgres/admin.password into `folder`."""
    from bridge.security.lab import NATS_ROLES, LabCredentials
    from bridge.security.tokens import write_private

    creds = LabCredentials(folder)
    route = creds.folder / "nats" / "route.password"
    if not route.is_file():
        write_private(route, secrets.token_urlsafe(32).encode())
    users = creds.folder / "nats" / "users.conf"
    text = nats_users_conf({r: creds.nats_password(r) for r in NATS_ROLES}, route.read_text().strip(), cost=cost)
    write_private(users, text.encode())
    admin = creds.folder / "postgres" / "admin.password"
    write_private(admin, creds.pg_password("admin").encode())
    return [route, users, admin]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python deploy/credentials.py", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path, help="a folder written by `tether cluster certs`")
    a = p.parse_args(argv)
    try:
        for path in make(a.folder):
            print(path)
    except Exception as exc:  # noqa: BLE001 - one line naming the folder, never a secret
        raise SystemExit(f"deploy/credentials.py {a.folder}: {exc}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
