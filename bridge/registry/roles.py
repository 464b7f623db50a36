"""The registry's database roles on PostgreSQL, set up by its admin: the gateways' least-privilege role, the schema
migrated and the privileges granted. Passwords travel in libpq passfiles only (`*:*:*:USER:PASSWORD`, mode 0600).

    password = write_passfile(Path("creds/gateway.pgpass"), "tether_gateway")      # a new random password
    prepare("postgresql://tether@db:5432/tether?passfile=/creds/admin.pgpass",      # as the admin (a superuser)
            gateway_passfile=Path("creds/gateway.pgpass"))
    Registry("postgresql://tether_gateway@db:5432/tether?passfile=/creds/gateway.pgpass")   # a gateway: no CREATE

`prepare` is idempotent (run it after every upgrade of Tether: it migrates and grants what the new code needs).
From a shell (a Kubernetes Job, an operator; `tether.cluster.postgres.PostgresServer` runs it at every start):

    python -m bridge.registry.roles --registry "postgresql://tether@db:5432/tether?sslmode=verify-full&sslrootcert=ca.crt"
        --registry-passfile creds/postgres/admin.pgpass --gateway-passfile creds/postgres/gateway.pgpass

The role's password is turned into a SCRAM-SHA-256 verifier here, by libpq (`PQencryptPasswordConn`): the plaintext
never reaches the server, its log or pg_stat_activity.

    >>> parse_passfile("# made by tether\\n*:*:*:tether_gateway:s3cr\\\\:et\\n")
    ('tether_gateway', 's3cr:et')
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

from bridge.registry.backends import PostgresBackend, connect, is_url, shown, with_passfile
from bridge.registry.errors import RegistryError
from bridge.registry.migrations import GATEWAY_ROLE, ROLE_NAME, grant, migrate

__all__ = ["GATEWAY_ROLE", "parse_passfile", "prepare", "read_passfile", "write_passfile"]

# what the gateway's role is not, spelled out (each is the default for CREATE ROLE: said anyway, and ALTER resets it)
_ROLE_OPTIONS = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS"


def parse_passfile(text: str) -> tuple[str, str]:
    """(user, password) of the first entry of a libpq passfile's text (`\\:` and `\\\\` unescaped)."""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields, field, escaped = [], "", False
        for ch in line:
            if escaped:
                field, escaped = field + ch, False
            elif ch == "\\":
                escaped = True
            elif ch == ":" and len(fields) < 4:
                fields.append(field)
                field = ""
            else:
                field += ch
        if len(fields) == 4 and fields[3] and field:
            return fields[3], field
        break
    raise RegistryError("a passfile entry must read HOST:PORT:DATABASE:USER:PASSWORD (e.g. *:*:*:tether_gateway:...)")


def read_passfile(path: Path) -> tuple[str, str]:
    """(user, password) of the passfile at `path`; RegistryError naming the path when it is missing or malformed."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RegistryError(f"cannot read the passfile {str(path)!r}: {exc.strerror}") from None
    try:
        return parse_passfile(text)
    except RegistryError as exc:
        raise RegistryError(f"passfile {str(path)!r}: {exc}") from None


def write_passfile(path: Path, user: str, password: str | None = None) -> str:
    """Write `*:*:*:USER:PASSWORD` to `path` (0600, atomically); a random password when none is given. Returns it."""
    from bridge.security.tokens import write_private

    password = password or secrets.token_urlsafe(32)
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_private(Path(path), f"*:*:*:{user}:{escaped}\n".encode())
    return password


def prepare(admin_url: str, *, gateway_passfile: Path, role: str = GATEWAY_ROLE) -> None:
    """As the admin at `admin_url`: create (or reset) `role` with the password in `gateway_passfile`, migrate the
    registry's schema and grant `role` exactly what a gateway uses (bridge.registry.migrations.grant)."""
    import psycopg
    from psycopg import sql

    user, password = read_passfile(gateway_passfile)
    if user != role or not ROLE_NAME.fullmatch(role):
        raise RegistryError(f"passfile {str(gateway_passfile)!r} is for user {user!r}, not the gateway role {role!r}")
    with connect(admin_url, application_name="tether-admin") as conn:
        try:
            verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256").decode()
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is not None
            conn.execute(sql.SQL("{} ROLE {} {} PASSWORD {}").format(
                sql.SQL("ALTER" if exists else "CREATE"), sql.Identifier(role), sql.SQL(_ROLE_OPTIONS),
                sql.Literal(verifier)))
        except psycopg.Error as exc:
            raise RegistryError(f"cannot set up role {role!r} in {shown(admin_url)}: {exc.diag.message_primary or exc}"
                                ) from None
    backend = PostgresBackend(admin_url)
    try:
        backend.begin()
        try:
            migrate(backend)
            grant(backend, role)
        except BaseException:
            backend.rollback()
            raise
        backend.commit()
    except backend.Error as exc:
        raise RegistryError(f"cannot migrate the registry {backend.where!r} as its admin: {exc}") from None
    finally:
        backend.close()


def main(argv: list[str] | None = None) -> int:
    """`python -m bridge.registry.roles`: `prepare` from the command line; 0 when done, 2 with the reason."""
    p = argparse.ArgumentParser(prog="python -m bridge.registry.roles", description=prepare.__doc__)
    p.add_argument("--registry", required=True, metavar="URL", help="the admin's postgresql://USER@HOST:PORT/DB")
    p.add_argument("--registry-passfile", type=Path, metavar="PATH", help="the admin's libpq passfile")
    p.add_argument("--gateway-passfile", type=Path, required=True, metavar="PATH", help="the gateway role's passfile")
    p.add_argument("--role", default=GATEWAY_ROLE, help="the gateway role's name")
    a = p.parse_args(argv)
    try:
        if not is_url(a.registry):
            raise RegistryError(f"--registry {shown(a.registry)!r} is not a postgresql:// URL")
        prepare(with_passfile(a.registry, a.registry_passfile), gateway_passfile=a.gateway_passfile, role=a.role)
    except RegistryError as exc:
        print(f"python -m bridge.registry.roles: {exc}", file=sys.stderr)
        return 2
    print(f"{shown(a.registry)}: schema migrated, role {a.role} granted what a gateway uses")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
