"""One engine of the fleet as a process of its own, run inside a lab host (tests/support/hosts.py):

    host.popen([sys.executable, "-m", "tests.hosts.roles", "triton", "--dir", D, "--host", ADDR, "--creds", C])
    # prints "ready <address>" once the engine serves, stops it on SIGTERM / SIGINT, then exits

The engine classes (TritonServer, PostgresServer, NatsCluster) spawn their servers from the calling
process, so the calling process is what must live in the host's network namespace: this module is that
process. Roles: `triton` (restricted by the lab's triton.secret), `postgres` (scram + TLS, the gateway's
least-privilege role), `nats` (TLS, per-role users), `rendezvous` is `python -m trainer.rendezvous` itself.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

READY = "ready "


def _triton(a: argparse.Namespace):
    from inference_server import ModelRepository, TritonServer
    from inference_server.secret import read_secret
    from tests.conftest import ACT, OBS
    from trainer.policy import MLPPolicy

    repo = ModelRepository(a.dir / "models")
    repo.write_version("tiny", 1, MLPPolicy(OBS[0], ACT[0], seed=0).eval(), OBS, ACT)
    server = TritonServer(repo.root, models=["tiny"], host=a.host, log_path=a.dir / "triton.log",
                          secret=read_secret(a.creds / "triton.secret"))
    server.start()
    return server.grpc_url, server.stop


def _postgres(a: argparse.Namespace):
    from tether.cluster.postgres import PostgresServer

    pg = PostgresServer(a.dir / "pg", **_postgres_security(a))
    pg.start()
    return pg.url, pg.stop


def _postgres_security(a: argparse.Namespace) -> dict:
    """PostgresServer's secured-mode arguments from the lab's credentials folder."""
    from bridge.security.lab import LabCredentials

    creds = LabCredentials(a.creds)
    crt, key = creds.server_pair("postgres")
    return {"listen": a.host, "admin_passfile": creds.pgpass("admin"), "gateway_passfile": creds.pgpass("gateway"),
            "tls_cert": crt, "tls_key": key, "tls_ca": creds.ca}


def _nats(a: argparse.Namespace):
    from tether.cluster.nats import NatsCluster, NatsSecurity

    nats = NatsCluster(a.dir / "nats", servers=a.servers, host=a.host, security=NatsSecurity.from_folder(a.creds))
    nats.start()
    return nats.url, nats.stop


ROLES = {"triton": _triton, "postgres": _postgres, "nats": _nats}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.hosts.roles")
    p.add_argument("role", choices=sorted(ROLES))
    p.add_argument("--dir", type=Path, required=True, help="the role's data and logs")
    p.add_argument("--host", required=True, help="the address to bind (the lab host's)")
    p.add_argument("--creds", type=Path, required=True, help="the lab's credentials folder (tether cluster certs)")
    p.add_argument("--servers", type=int, default=1, help="nats: servers in the cluster")
    a = p.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    address, stop = ROLES[a.role](a)
    print(f"{READY}{address}", flush=True)
    try:
        done.wait()
    finally:
        stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
