"""Every credential a fleet's engines need, made by one command into one folder (`tether cluster certs`).

    creds = LabCredentials.create(Path("runs/cluster/credentials"), hosts=["gw.lab", "198.18.0.2"])
    creds.server_pair("nats")            # (nats-server.crt, nats-server.key), signed by creds.ca
    creds.nats_password_file("gateway")  # nats/gateway.password (0600): `--nats-user gateway --nats-password-file`
    creds.pgpass("gateway")              # postgres/gateway.pgpass (0600): `--registry-passfile`
    creds.token_file("sim")              # tokens/sim.token: a robot token for `tether sim` ($TETHER_TOKEN)
    creds = LabCredentials(Path("runs/cluster/credentials"))   # later: the same folder, read back

The folder (keys, passwords and secrets 0600; certificates 0644):

    ca.crt ca.key                        the lab CA (keep ca.key off every engine)
    server.crt server.key                the gateways' server certificate (`tether certs init`'s)
    nats-server.* postgres-server.* triton-server.*   one server certificate per engine
    nats/{admin,gateway,trainer,archiver}.password    NATS users, one per role
    postgres/{admin,gateway}.pgpass                   libpq passfiles (`*:*:*:USER:PASSWORD`)
    triton.secret                        the header secret only gateways send to Triton
    rendezvous.id                        the trainer run id: random, so it cannot be guessed
    tokens.json tokens/{sim,operator,trainer}.token   gateway tokens (hashed in tokens.json)

Every engine certificate names 127.0.0.1, ::1, localhost and `hosts` (each engine's address on the lab
network, or one DNS name per engine). A role gets only its own files: a trainer the CA, its token, its
NATS password and the run id, never a server key (deploy/README.md maps them onto Secrets).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from pathlib import Path

from bridge.security.certs import CertError, init_certs
from bridge.security.engine_certs import issue_server
from bridge.security.tokens import TokenStore, write_private

__all__ = ["ENGINES", "NATS_ROLES", "PG_ROLES", "PG_USERS", "TOKEN_ROLES", "LabCredentials"]

ENGINES = ("nats", "postgres", "triton")
NATS_ROLES = ("admin", "gateway", "trainer", "archiver")
PG_ROLES = ("admin", "gateway")
PG_USERS = {"admin": "tether", "gateway": "tether_gateway"}   # the database roles the passfiles log in as
TOKEN_ROLES = {"sim": "robot", "operator": "operator", "trainer": "trainer"}


def _secret() -> str:
    return secrets.token_urlsafe(32)


class LabCredentials:
    """The credentials folder of one fleet; `create` makes it, the constructor reads an existing one."""

    def __init__(self, folder: Path | str, *, check: bool = True):
        """`check=False`: only the paths (for a command line), the folder may not exist yet."""
        self.folder = Path(folder)
        if check and not (self.folder / "ca.crt").exists():
            raise CertError(f"no lab credentials in {self.folder} (run `tether cluster certs {self.folder}`)")

    @classmethod
    def create(cls, folder: Path | str, *, hosts: Iterable[str] = (), force: bool = False) -> LabCredentials:
        """Make every credential in `folder`; refuses to replace an existing CA unless `force`."""
        folder, hosts = Path(folder), list(hosts)
        init_certs(folder, hosts=hosts, force=force)
        for engine in ENGINES:
            issue_server(folder, f"{engine}-server", hosts, client_auth=True)  # NATS routes dial each other
        for role in NATS_ROLES:
            write_private(folder / "nats" / f"{role}.password", _secret().encode())
        for role in PG_ROLES:
            write_private(folder / "postgres" / f"{role}.pgpass", f"*:*:*:{PG_USERS[role]}:{_secret()}\n".encode())
        write_private(folder / "triton.secret", _secret().encode())
        write_private(folder / "rendezvous.id", f"tether-{_secret()}".encode())
        tokens = folder / "tokens.json"
        tokens.unlink(missing_ok=True)
        store = TokenStore(tokens)
        for name, role in TOKEN_ROLES.items():
            write_private(folder / "tokens" / f"{name}.token", store.add(name, role=role).encode())
        for sub in ("nats", "postgres", "tokens"):
            (folder / sub).chmod(0o700)
        return cls(folder)

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    def server_pair(self, engine: str) -> tuple[Path, Path]:
        """(certificate, key) of `engine` ("gateway" or one of ENGINES)."""
        stem = "server" if engine == "gateway" else f"{_known(engine, ENGINES, 'engine')}-server"
        return self.folder / f"{stem}.crt", self.folder / f"{stem}.key"

    def nats_password_file(self, role: str) -> Path:
        return self.folder / "nats" / f"{_known(role, NATS_ROLES, 'NATS role')}.password"

    def nats_password(self, role: str) -> str:
        return self.nats_password_file(role).read_text().strip()

    def pgpass(self, role: str) -> Path:
        return self.folder / "postgres" / f"{_known(role, PG_ROLES, 'PostgreSQL role')}.pgpass"

    def pg_password(self, role: str) -> str:
        return self.pgpass(role).read_text().strip().rsplit(":", 1)[1]

    @property
    def triton_secret_file(self) -> Path:
        return self.folder / "triton.secret"

    @property
    def rendezvous_id_file(self) -> Path:
        return self.folder / "rendezvous.id"

    @property
    def tokens_file(self) -> Path:
        return self.folder / "tokens.json"

    def token_file(self, name: str) -> Path:
        return self.folder / "tokens" / f"{_known(name, tuple(TOKEN_ROLES), 'token holder')}.token"

    def token(self, name: str) -> str:
        return self.token_file(name).read_text().strip()


def _known(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise CertError(f"unknown {what} {value!r}; one of {', '.join(allowed)}")
    return value
