"""`tether cluster`: `up` starts PostgreSQL, a NATS JetStream cluster, Triton replicas, gateways and an
elastic trainer as real processes on loopback (tether.cluster.up), prints their addresses and stops them all
on Ctrl-C or SIGTERM; `certs` writes every engine's credentials (bridge.security.lab).

    tether cluster up --gateways 2 --tritons 2 --trainer-nodes 2 --run-dir runs/cluster --summary up.json
    tether cluster certs runs/cluster/credentials --host 10.0.0.5
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from bridge.common.errors import CommandError

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether cluster", description="The fleet's roles as local processes.")
    sub = p.add_subparsers(dest="action", required=True, metavar="{up,certs}")
    up = sub.add_parser("up", prog="tether cluster up", help="start every role, print the addresses, "
                        "stop them all on Ctrl-C / SIGTERM",
                        description="PostgreSQL (registry), a NATS JetStream cluster (experience), Triton "
                        "replicas, gateways and elastic trainer nodes on loopback; docs/scale_out.md.")
    up.add_argument("--gateways", type=int, default=2, help="`tether gateway` processes")
    up.add_argument("--tritons", type=int, default=2, help="tritonserver replicas (one shared model repository)")
    up.add_argument("--trainer-nodes", type=int, default=2, help="`tether train` nodes (torchrun agents, c10d "
                    "rendezvous, --nnodes 1:N; 0: no trainer)")
    up.add_argument("--nats-servers", type=int, default=3, help="nats-server processes (JetStream, routed)")
    up.add_argument("--env", default="InvertedPendulum-v5", help="the env whose freshly initialised policy is "
                    "served as v1 (a Gaussian policy when there are trainer nodes)")
    up.add_argument("--run-dir", default="", help="data, logs and checkpoints (default: a temp dir)")
    up.add_argument("--summary", default="", metavar="PATH", help="write the roles (role, address, pids) as JSON "
                    "here once all are up")
    up.add_argument("--seed", type=int, default=0, help="seed of the initial policy and the trainer")
    certs = sub.add_parser("certs", prog="tether cluster certs", help="every engine's credentials in one folder",
                           description="A lab CA, a server certificate per engine, NATS and PostgreSQL passwords "
                           "per role, the Triton secret, a random trainer run id and gateway tokens "
                           "(bridge/security/lab.py lists the files; deploy/README.md maps them onto Secrets).")
    certs.add_argument("dir", type=Path, help="the folder to write (keys and passwords 0600)")
    certs.add_argument("--host", action="append", default=[], help="a name or IP an engine is reached at "
                       "(repeatable; 127.0.0.1, ::1 and localhost always)")
    certs.add_argument("--force", action="store_true", help="replace an existing CA and every credential")
    return p


class _Stop(BaseException):  # noqa: N818 - like KeyboardInterrupt: no `except Exception` swallows it
    """SIGINT / SIGTERM: leave the wait (or the start-up) and stop every role."""


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    return certs(a) if a.action == "certs" else up(a)


def certs(a: argparse.Namespace) -> int:
    from bridge.security.certs import CertError
    from bridge.security.lab import LabCredentials

    try:
        creds = LabCredentials.create(a.dir, hosts=a.host, force=a.force)
    except CertError as exc:
        raise CommandError(exc, prog="tether cluster certs") from None
    for path in sorted(p for p in creds.folder.rglob("*") if p.is_file()):
        print(f"{oct(path.stat().st_mode & 0o777)[2:]}  {path}")
    print(f"keep {creds.folder / 'ca.key'} off every engine: whoever holds it can issue any identity",
          file=sys.stderr)
    return 0


def up(a: argparse.Namespace) -> int:
    from bridge.common.files import write_json
    from tether.cluster.up import Cluster, ClusterSpec, roles

    run_dir = Path(a.run_dir or tempfile.mkdtemp(prefix="tether-cluster-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        spec = ClusterSpec(run_dir=run_dir, gateways=a.gateways, tritons=a.tritons, trainer_nodes=a.trainer_nodes,
                           nats_servers=a.nats_servers, env=a.env, seed=a.seed)
    except ValueError as exc:
        raise CommandError(exc, prog="tether cluster up") from None

    def on_term(*_):
        raise _Stop

    # SIGINT too, explicitly: a process started in the background inherits SIGINT ignored
    previous = {sig: signal.signal(sig, on_term) for sig in (signal.SIGINT, signal.SIGTERM)}
    print(f"run dir {run_dir}", flush=True)
    t0 = [time.monotonic()]

    def started(name: str, running) -> None:
        now = time.monotonic()
        print(f"  started {name} {running.address} ({now - t0[0]:.1f} s)", flush=True)
        t0[0] = now

    cluster = Cluster(roles(spec), on_started=started)
    try:
        cluster.start()
        print(cluster.table(), flush=True)
        if a.summary:
            write_json(Path(a.summary), {"run_dir": str(run_dir), "roles": cluster.describe()})
        print("cluster up; Ctrl-C or SIGTERM stops every process", flush=True)
        while True:
            signal.pause()  # until SIGINT or SIGTERM (_Stop)
    except (KeyboardInterrupt, _Stop):
        print("stopping the cluster", file=sys.stderr, flush=True)
    finally:
        for sig in previous:  # a second Ctrl-C / SIGTERM does not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        try:
            cluster.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    print("cluster stopped", flush=True)
    return 0
