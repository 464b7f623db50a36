"""`tether cluster up`: the fleet's roles as real processes on loopback, declared in one function.

    tether cluster up --gateways 2 --tritons 2 --trainer-nodes 2 --run-dir runs/cluster
    # role        address                                          pid
    # postgres    postgresql://tether@127.0.0.1:41234/tether       1234
    # nats        nats://127.0.0.1:4222,nats://127.0.0.1:4223,...  1240,1241,1242
    # triton-0    127.0.0.1:8001                                   ...
    # gateway-0   127.0.0.1:50051                                  ...
    # rendezvous  127.0.0.1:29400                                  ...
    # trainer-0   node 1 of 1:2 at 127.0.0.1:29400                 ...
    # Ctrl-C (SIGINT) or SIGTERM stops every process, the last started first.

In code:

    with Cluster(roles(ClusterSpec(run_dir=Path("runs/c"), gateways=2, tritons=1, trainer_nodes=0))) as cluster:
        cluster.address("gateway-0")           # "127.0.0.1:PORT": point `tether sim --gateway` here
        print(cluster.table())

`roles(spec)` is the one place that says what runs, in which order and with which flags (Acme's
program declaration); `Cluster` is generic: it starts each role given the roles started before it,
and stops them in reverse order, each process group with it, whatever failed. The same roles run
as Kubernetes workloads in `deploy/` (tests/test_deploy.py checks both name the same ports and flags).

Every engine runs with the credentials of `<run-dir>/credentials` (`tether cluster certs`, made at the first
start; bridge/security/lab.py): PostgreSQL with scram-sha-256 over TLS, the gateways logging in as the
least-privilege `tether_gateway`; NATS with TLS and one user per role (the admin creates the stream; gateways
only publish, trainers only consume); Triton answering only the gateways' secret header; gateways with TLS
and tokens (`tokens/sim.token` is a robot's: `TETHER_TOKEN=$(cat ...) tether sim --tls-ca .../ca.crt`); the
rendezvous bound to exactly its address, the trainers meeting under the random `rendezvous.id`. No secret
is on a command line (except Triton's, which it reads nowhere else: docs/security.md).

Every gateway shares the registry (PostgreSQL), streams experience to the NATS JetStream cluster
(and keeps its own local log for the trainer's Experience.Subscribe) and routes to every Triton
replica; the replicas serve one shared model repository. The trainer nodes are `tether train`
launchers meeting at a c10d rendezvous store of their own (`python -m trainer.rendezvous`), so any
node may die and rejoin; they train PPO from the JetStream stream (every gateway's sessions; a
durable consumer per rank) and publish through gateway-0, open-ended (touch
`<run-dir>/trainer.stop` to end them cleanly) and checkpoint into `<run-dir>/checkpoints`.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bridge.common.lifecycle import Started
from bridge.common.processes import Child, NotReady

__all__ = ["Cluster", "ClusterError", "ClusterSpec", "Role", "Running", "roles"]

_ROOT = Path(__file__).resolve().parents[2]
RENDEZVOUS_PORT = 29400  # deploy/: the rendezvous Service's port (here: a free one)
GATEWAY_PORT = 50051     # deploy/: the gateways' port (here: free ones)


class ClusterError(RuntimeError):
    """A role did not start; the message names it and where its log is."""


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    run_dir: Path
    gateways: int = 2
    tritons: int = 2
    trainer_nodes: int = 2
    nats_servers: int = 3
    env: str = "InvertedPendulum-v5"
    seed: int = 0

    def __post_init__(self):
        for name, least in (("gateways", 1), ("tritons", 1), ("trainer_nodes", 0), ("nats_servers", 1)):
            if getattr(self, name) < least:
                raise ValueError(f"--{name.replace('_', '-')} must be at least {least}, got {getattr(self, name)}")


class Running(Protocol):
    """A started role: where to reach it, its process (group leader) ids, and how to stop it."""

    address: str

    def pids(self) -> list[int]: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Role:
    """One process (or a set that is one service) of the cluster. `start` gets the roles started before it."""

    name: str
    start: Callable[[Mapping[str, Running]], Running]


def roles(spec: ClusterSpec) -> list[Role]:
    """The cluster, in start order: the stores, the inference replicas, the gateways, the trainer."""
    out = [Role("postgres", functools.partial(_postgres, spec)),
           Role("nats", functools.partial(_nats, spec))]
    out += [Role(f"triton-{i}", functools.partial(_triton, spec, i)) for i in range(spec.tritons)]
    out += [Role(f"gateway-{i}", functools.partial(_gateway, spec, i)) for i in range(spec.gateways)]
    if spec.trainer_nodes:
        out.append(Role("rendezvous", functools.partial(_rendezvous, spec)))
        out += [Role(f"trainer-{i}", functools.partial(_trainer, spec, i)) for i in range(spec.trainer_nodes)]
    return out


# -- the roles' starters: processes and addresses, no logic ---------------------------------------

@dataclass
class _Started:
    address: str
    stop_fn: Callable[[], None]
    pid_fn: Callable[[], list[int]]

    def pids(self) -> list[int]:
        return [p for p in self.pid_fn() if p]

    def stop(self) -> None:
        self.stop_fn()


def credentials(spec: ClusterSpec, *, make: bool = True):
    """The cluster's LabCredentials: `<run-dir>/credentials`, made at the first start (`make`) and kept after;
    `make=False`: only its paths (the command lines of gateway_args / trainer_args)."""
    from bridge.security.lab import LabCredentials

    folder = spec.run_dir / "credentials"
    if not make or (folder / "ca.crt").exists():
        return LabCredentials(folder, check=make)
    return LabCredentials.create(folder)


def _policy(spec: ClusterSpec) -> str:
    from tether.initial_policy import policy_name

    return policy_name(spec.env)


def _postgres(spec: ClusterSpec, up: Mapping[str, Running]) -> Running:
    from tether.cluster.postgres import PostgresServer

    creds = credentials(spec)
    crt, key = creds.server_pair("postgres")
    pg = PostgresServer(spec.run_dir / "postgres", tls_cert=crt, tls_key=key, tls_ca=creds.ca,
                        admin_passfile=creds.pgpass("admin"), gateway_passfile=creds.pgpass("gateway"))
    pg.start()
    return _Started(pg.client("gateway")[0], pg.stop, lambda: [pg.pid])


def _nats(spec: ClusterSpec, up: Mapping[str, Running]) -> Running:
    from tether.cluster.nats import NatsCluster, NatsSecurity

    nats = NatsCluster(spec.run_dir / "nats", servers=spec.nats_servers,
                       security=NatsSecurity.from_folder(credentials(spec).folder))
    try:
        nats.start()
    except BaseException:
        nats.stop()
        raise
    return _Started(nats.url, nats.stop, lambda: [nats.pid(i) for i in range(spec.nats_servers)])


def _triton(spec: ClusterSpec, i: int, up: Mapping[str, Running]) -> Running:
    from inference_server import ModelRepository, TritonServer
    from inference_server.secret import read_secret
    from tether.initial_policy import write_initial_policy

    repo = ModelRepository(spec.run_dir / "models")  # one repository, served by every replica
    name = write_initial_policy(repo, spec.env, seed=spec.seed, stochastic=spec.trainer_nodes > 0)
    triton = TritonServer(repo.root, models=[name], log_path=spec.run_dir / f"triton-{i}.log",
                          secret=read_secret(credentials(spec).triton_secret_file))
    triton.start()
    return _Started(triton.grpc_url, triton.stop, lambda: [triton.pid])


def gateway_args(spec: ClusterSpec, i: int, up: Mapping[str, Running]) -> list[str]:
    """`tether gateway`'s flags for gateway `i` (deploy/ gives its pods the same)."""
    tritons = ",".join(up[f"triton-{j}"].address for j in range(spec.tritons))
    creds = credentials(spec, make=False)
    crt, key = creds.server_pair("gateway")
    args = ["--triton", tritons, "--policy", _policy(spec), "--gateway-id", f"gateway-{i}",
            "--registry", up["postgres"].address, "--registry-passfile", str(creds.pgpass("gateway")),
            "--experience", up["nats"].address, "--nats-user", "gateway",
            "--nats-password-file", str(creds.nats_password_file("gateway")), "--nats-ca", str(creds.ca),
            "--experience-dir", str(spec.run_dir / f"gateway-{i}" / "experience"),
            "--model-repository", str(spec.run_dir / "models"), "--triton-timeout", "60",
            "--triton-secret-file", str(creds.triton_secret_file), "--tls-cert", str(crt), "--tls-key", str(key),
            "--tokens", str(creds.tokens_file), "--no-anonymous-viewers"]
    if spec.trainer_nodes:
        args += ["--switch", "step"]  # sessions act with each new version from their next step (as the demo)
    return args


def _gateway(spec: ClusterSpec, i: int, up: Mapping[str, Running]) -> Running:
    from tether.stack import GatewayProcess, StackError

    args = gateway_args(spec, i, up)
    (spec.run_dir / f"gateway-{i}").mkdir(parents=True, exist_ok=True)
    gw = GatewayProcess(triton_url=args[1], policy=args[3], extra_args=args[4:], log_path=spec.run_dir /
                        f"gateway-{i}.log", timeout=120.0)
    try:
        address = gw.start()
    except StackError as exc:
        raise ClusterError(f"gateway-{i}: {exc}") from None
    return _Started(address, gw.stop, lambda: [gw.pid])


def _rendezvous(spec: ClusterSpec, up: Mapping[str, Running]) -> Running:
    from trainer.rendezvous import READY

    (spec.run_dir / "trainer.stop").unlink(missing_ok=True)  # a stop file of an earlier run in this folder
    proc = _child("rendezvous", [sys.executable, "-m", "trainer.rendezvous", "--host", "127.0.0.1", "--port", "0"],
                  spec.run_dir / "rendezvous.log", ready=READY)
    return _Started(proc.ready_value, proc.stop, lambda: [proc.pid])


def trainer_args(spec: ClusterSpec, up: Mapping[str, Running]) -> list[str]:
    """`tether train`'s flags for every trainer node (deploy/ gives its pods the same)."""
    creds = credentials(spec, make=False)
    return ["--nnodes", f"1:{spec.trainer_nodes}", "--rdzv-endpoint", up["rendezvous"].address,
            "--rdzv-id-file", str(creds.rendezvous_id_file), "--rdzv-external", "--nproc", "1",
            "--max-restarts", "100", "--gateway", up["gateway-0"].address, "--tls-ca", str(creds.ca),
            "--experience", up["nats"].address, "--nats-user", "trainer",
            "--nats-password-file", str(creds.nats_password_file("trainer")), "--nats-ca", str(creds.ca),
            "--algo", "ppo", "--policy", _policy(spec),
            "--checkpoint-dir", str(spec.run_dir / "checkpoints"), "--stop-file", str(spec.run_dir / "trainer.stop"),
            "--seed", str(spec.seed)]


def _trainer(spec: ClusterSpec, i: int, up: Mapping[str, Running]) -> Running:
    cmd = [sys.executable, "-m", "tether", "train", *trainer_args(spec, up),
           "--summary", str(spec.run_dir / f"trainer-{i}.json")]
    env = {**os.environ, "TETHER_TOKEN": credentials(spec).token("trainer")}   # never on a command line
    proc = _child(f"trainer-{i}", cmd, spec.run_dir / f"trainer-{i}.log", env=env)
    where = f"node of {spec.trainer_nodes} at {up['rendezvous'].address}, log {proc.log_path.name}"
    return _Started(where, proc.stop, lambda: [proc.pid])


def _child(name: str, cmd: Sequence[str], log_path: Path, *, ready: str = "",
           env: Mapping[str, str] | None = None) -> Child:
    """`cmd` started in a process group of its own, its output to `log_path`; with `ready`, once a stdout line
    starts with it (`ready_value`: the rest of it). ClusterError when it does not start within 60 s."""
    child = Child(cmd, log_path, name=name, ready=ready, env=env, cwd=_ROOT, timeout=60.0, grace_s=15.0)
    try:
        child.start()
    except NotReady as exc:
        raise ClusterError(str(exc)) from None
    return child


# -- the generic part -------------------------------------------------------------------------------

class Cluster(Started):
    """Starts `roles` in order (each sees the ones before it), stops them in reverse; a context manager."""

    def __init__(self, roles: Sequence[Role], *, on_started: Callable[[str, Running], None] | None = None):
        names = [r.name for r in roles]
        if len(set(names)) != len(names):
            raise ValueError(f"role names must be unique, got {names}")
        self.roles, self.on_started = list(roles), on_started
        self.running: dict[str, Running] = {}

    def start(self) -> Cluster:
        try:
            for role in self.roles:
                self.running[role.name] = role.start(dict(self.running))
                if self.on_started is not None:
                    self.on_started(role.name, self.running[role.name])
        except BaseException:
            self.stop()
            raise
        return self

    def address(self, name: str) -> str:
        return self.running[name].address

    def stop(self) -> None:
        """Stop every started role, the last started first; an error in one does not keep the rest running."""
        errors = []
        while self.running:
            name, running = self.running.popitem()
            try:
                running.stop()
            except Exception as exc:  # noqa: BLE001 - reported after the others are stopped
                errors.append(f"{name}: {exc}")
        if errors:
            raise ClusterError("stopping: " + "; ".join(errors))

    def table(self) -> str:
        rows = [("role", "address", "pid")]
        rows += [(name, r.address, ",".join(str(p) for p in r.pids())) for name, r in self.running.items()]
        widths = [max(len(row[k]) for row in rows) for k in range(2)]
        return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c}" for a, b, c in rows)

    def describe(self) -> list[dict]:
        """Every running role as {"role", "address", "pids"} (what `--summary` writes)."""
        return [{"role": name, "address": r.address, "pids": r.pids()} for name, r in self.running.items()]
