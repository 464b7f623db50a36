"""What TLS and authentication cost a fleet per transition: NATS JetStream publishing and PostgreSQL's
promote-to-follower path, open vs secured, on loopback and between two lab hosts, blocks alternated in one run.

    sudo python benchmarks/secured_fleet.py [--rounds 6 --transitions 4000 --pings 300 --writes 80
                                             --connects 5 --placements loopback,lab --json PATH]

Placements: `loopback` (servers and client on 127.0.0.1 of this machine) and `lab` (the servers on one lab host,
the client on another: Linux network namespaces joined by veth pairs on a bridge, `tests/support/hosts.Lab`, which
needs root; the benchmark imports it and `tests/hosts/fleet.Placed` from tests/). Configurations per placement:

- open:    nats-server without TLS or users (`NatsCluster(insecure=True)` on a lab address); PostgreSQL in trust
           mode, the admin role (on a lab address: an hba file admitting the lab's 198.18.0.0/15 only, in the
           lab's isolated namespace: the product itself refuses trust off loopback);
- secured: the lab credentials of `tether cluster certs` (`Placed` makes them): `NatsSecurity.from_folder`
           (TLS, user `gateway` with its password file and least-privilege permissions; the admin made the
           stream); PostgreSQL with scram-sha-256 + TLS, the client `tether_gateway` with `sslmode=verify-full`.

One client process per placement (`--worker`, inside the client host) holds both configurations' connections
and runs the block the main process names, so blocks alternate open/secured (and placements) in every round
(after one short warm-up block of each, not reported):

- nats: `JetStreamLog` (the gateway's publisher) appends `--transitions` serialized `tether.v1.Transition`s
  (11-float observation, 3-float action) as fast as it takes them: transitions/s from the first append until
  every one is durable (PubAck'd); then `--pings` appended one at a time: append -> durable latency; then
  `--connects` new connections (TCP, TLS, CONNECT with the user, first PING/PONG).
- pg: `--writes` registry writes (`Registry.record_event`: one transaction bumping the epoch with NOTIFY, the
  path of every promote) on one connection, each timed until an `EpochFollower` (a second gateway's follower,
  its own connection) reports the new epoch: write -> notified; then `--connects` new connections
  (`bridge.registry.backends.connect` + SELECT 1: what a reconnect pays).

Reported: per placement and measure the median of the block medians (latencies: pooled p50/p99) open and secured
side by side, and secured/open. Prints a table and progress lines, writes JSON (default
benchmarks/results/secured_fleet.json). Every loop is bounded; traffic goes to loopback or the lab's own hosts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/secured_fleet.py` from the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks.bench import parser, report, say  # noqa: E402
from bridge.common.percentiles import p50_p99  # noqa: E402

CONFIGS = ("open", "secured")
ROLES = ("nats-open", "nats-secured", "pg-open", "pg-secured")


# -- servers (`--serve ROLE`, run inside the server's host) --------------------------------------------------------

def _serve(a: argparse.Namespace) -> int:
    """Start one engine on `a.host`, print "ready <url>", stop it on SIGTERM/SIGINT."""
    from bridge.common.net import is_loopback
    from tether.cluster.nats import NatsCluster, NatsSecurity
    from tether.cluster.postgres import PostgresServer

    a.dir.mkdir(parents=True, exist_ok=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    hba_dir = None
    if a.serve.startswith("nats-"):
        security = NatsSecurity.from_folder(a.creds) if a.serve == "nats-secured" else None
        engine = NatsCluster(a.dir / "nats", servers=1, host=a.host, security=security, insecure=security is None)
        engine.start()
        url = engine.url
    elif a.serve == "pg-open":
        settings = {}
        if not is_loopback(a.host):  # trust on a lab address: admit the lab's range only (see the docstring)
            hba_dir = Path(tempfile.mkdtemp(prefix="tether-bench-hba-"))
            hba_dir.chmod(0o755)  # the server runs as `postgres` (root is refused): it reads this file
            hba = hba_dir / "pg_hba.conf"
            hba.write_text("local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all 198.18.0.0/15 trust\n")
            hba.chmod(0o644)
            settings["hba_file"] = str(hba)
        engine = PostgresServer(a.dir / "pg", settings=settings)
        engine.listen = a.host  # after the constructor's loopback check: the lab namespace is isolated
        engine.start()
        url = engine.client("admin")[0]
    else:
        from bridge.security.lab import LabCredentials

        creds = LabCredentials(a.creds)
        crt, key = creds.server_pair("postgres")
        engine = PostgresServer(a.dir / "pg", listen=a.host, tls_cert=crt, tls_key=key, tls_ca=creds.ca,
                                admin_passfile=creds.pgpass("admin"), gateway_passfile=creds.pgpass("gateway"))
        engine.start()
        url = engine.client("gateway")[0]
    print(f"ready {url}", flush=True)
    try:
        done.wait()
    finally:
        engine.stop()
        if hba_dir is not None:
            for f in hba_dir.iterdir():
                f.unlink()
            hba_dir.rmdir()
    return 0


# -- the client (`--worker`, run inside the client's host) --------------------------------------------------------

def _transition(session: str, step: int):
    from protos import experience_pb2
    from protos.codec import encode

    return experience_pb2.Transition(session=session, step=step, policy="p",
                                     observation=[encode("observation", np.full(11, step, np.float32))],
                                     action=[encode("action", np.zeros(3, np.float32))])


class _Pg:
    """A registry writer and a follower (two connections) for one configuration."""

    def __init__(self, url: str):
        from bridge.registry.follow import EpochFollower
        from bridge.registry.store import Registry

        self.url = url
        self.registry = Registry(url)
        self.changed = threading.Event()
        self.at = 0.0
        self.follower = EpochFollower(url, on_change=self._on_change, poll_s=30.0)  # NOTIFY only: no poll backstop
        self.follower.start()
        if not self.changed.wait(30):
            raise RuntimeError(f"the follower of {url} reported no epoch within 30 s")

    def _on_change(self, epoch: int) -> None:
        self.at = time.perf_counter()
        self.changed.set()

    def block(self, writes: int, connects: int) -> dict:
        from bridge.registry.backends import connect

        notified, written, missed = [], [], 0
        for _ in range(writes):
            self.changed.clear()
            t0 = time.perf_counter()
            self.registry.record_event(kind="bench", who="secured_fleet", why="write to follower latency")
            written.append(time.perf_counter() - t0)
            if self.changed.wait(5):
                notified.append(self.at - t0)
            else:
                missed += 1
        setups = []
        for _ in range(connects):
            t0 = time.perf_counter()
            with connect(self.url, application_name="secured_fleet") as conn:
                conn.execute("SELECT 1").fetchone()
            setups.append(time.perf_counter() - t0)
        return {"notified_s": notified, "write_s": written, "connect_s": setups, "missed": missed}

    def close(self) -> None:
        self.follower.stop()
        self.registry.close()


class _Nats:
    """The gateway's publisher (`JetStreamLog`) for one configuration."""

    def __init__(self, url: str, auth, session: str):
        self.url, self.auth, self.session = url, auth, session
        self.step = 0
        self.log = None

    async def start(self) -> None:
        from bridge.experience.jetstream_log import JetStreamLog

        self.log = JetStreamLog(self.url, auth=self.auth, replicas=1)
        await self.log.start()

    async def block(self, transitions: int, pings: int, connects: int) -> dict:
        from bridge.experience.jetstream import connect

        t0 = time.perf_counter()
        futures = []
        for i in range(transitions):
            futures.append(self.log.append(_transition(self.session, self.step)))
            self.step += 1
            if i % 500 == 0:
                await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*futures), 60)
        burst = time.perf_counter() - t0
        latencies = []
        for _ in range(pings):
            t0 = time.perf_counter()
            await asyncio.wait_for(self.log.append(_transition(self.session, self.step)), 10)
            latencies.append(time.perf_counter() - t0)
            self.step += 1
        setups = []
        for _ in range(connects):
            t0 = time.perf_counter()
            nc = await connect(self.log.servers, name="secured_fleet", auth=self.auth)
            await nc.flush(5)
            setups.append(time.perf_counter() - t0)
            await nc.close()
        return {"per_second": transitions / burst, "ack_s": latencies, "connect_s": setups,
                "retries": self.log.stats.retries}

    async def close(self) -> None:
        await self.log.close()


async def _worker(a: argparse.Namespace) -> int:
    """Connect to every target of `a.targets` (JSON), say "ready", then run the block each stdin line names
    ("nats open", "pg secured", ...; "quit" ends) and print its result as one JSON line."""
    from bridge.experience.jetstream import NatsAuth
    from bridge.registry.backends import with_passfile

    targets = json.loads(Path(a.targets).read_text())
    nats, pg = {}, {}
    for config in CONFIGS:
        t = targets[config]
        auth = NatsAuth(user=t["nats_user"], password_file=Path(t["nats_password_file"]), ca=Path(t["nats_ca"])) \
            if config == "secured" else NatsAuth()
        nats[config] = _Nats(t["nats"], auth, f"bench-{config}")
        await nats[config].start()
        pg[config] = _Pg(with_passfile(t["pg"], t.get("pg_passfile")))
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                break
            engine, config, *warm = line  # "warm": a short block, not reported (first streams, caches, JIT)
            scale = 10 if warm else 1
            if engine == "nats":
                result = await nats[config].block(max(1, a.transitions // scale), max(1, a.pings // scale),
                                                  1 if warm else a.connects)
            else:
                result = await asyncio.to_thread(pg[config].block, max(1, a.writes // scale), 1 if warm else a.connects)
            print(json.dumps(result), flush=True)
    finally:
        for config in CONFIGS:
            await nats[config].close()
            pg[config].close()
    return 0


# -- the run --------------------------------------------------------------------------------------------------------

def _here():
    """A Host stand-in for this machine's own namespace (loopback placement)."""
    from tests.support.hosts import Host

    class Here(Host):
        def command(self, cmd):
            return list(cmd)

    return Here("loopback", "", {"lab": "127.0.0.1"})


def _serve_on(fleet, tmp: Path, placement: str, server, role: str) -> str:
    """Start one server role on `server`; its URL once it is ready."""
    _, url = fleet.start(f"{placement}-{role}", server,
                         [sys.executable, str(Path(__file__).resolve()), "--serve", role, "--host", server.address(),
                          "--creds", str(fleet.creds.folder), "--dir", str(tmp / placement / role)],
                         ready="ready ", timeout=300)
    say(f"{placement}: {role} ready at {url}")
    return url


def _place(fleet, tmp: Path, placement: str, client, urls: dict, a: argparse.Namespace) -> subprocess.Popen:
    """Start the worker on `client` for the servers at `urls`; returns it once it is ready."""
    creds = fleet.creds
    targets = {"open": {"nats": urls["nats-open"], "pg": urls["pg-open"]},
               "secured": {"nats": urls["nats-secured"], "nats_user": "gateway",
                           "nats_password_file": str(creds.nats_password_file("gateway")),
                           "nats_ca": str(creds.ca), "pg": urls["pg-secured"],
                           "pg_passfile": str(creds.pgpass("gateway"))}}
    path = tmp / f"{placement}-targets.json"
    path.write_text(json.dumps(targets))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--targets", str(path),
           "--transitions", str(a.transitions), "--pings", str(a.pings), "--writes", str(a.writes),
           "--connects", str(a.connects)]
    log = open(tmp / f"{placement}-worker.log", "a")  # noqa: SIM115 - closed with the run's folder
    worker = client.popen(cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    fleet.procs.append((f"{placement}-worker", worker, tmp / f"{placement}-worker.log"))
    line = worker.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"{placement} worker did not start (exit {worker.poll()}): "
                           f"{(tmp / f'{placement}-worker.log').read_text()[-3000:]}")
    return worker


def _ask(worker: subprocess.Popen, engine: str, config: str, *, warm: bool = False) -> dict:
    worker.stdin.write(f"{engine} {config}{' warm' if warm else ''}\n")
    worker.stdin.flush()
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError(f"the worker exited ({worker.poll()}) during the {engine} {config} block")
    return json.loads(line)


def _ms(seconds: float) -> float:
    return seconds * 1e3


def summarize(blocks: list[dict]) -> list[dict]:
    """Rows: (engine, placement, measure) with open, secured (medians of blocks; latencies pooled) and the ratio."""
    def pick(engine, placement, config):
        return [b["result"] for b in blocks if (b["engine"], b["placement"], b["config"]) == (engine, placement,
                                                                                            config)]

    measures = {
        "nats": [("transitions/s", "1/s", lambda rs: statistics.median(r["per_second"] for r in rs)),
                 ("publish->ack p50", "ms", lambda rs: _ms(p50_p99(s for r in rs for s in r["ack_s"])[0])),
                 ("publish->ack p99", "ms", lambda rs: _ms(p50_p99(s for r in rs for s in r["ack_s"])[1])),
                 ("connect p50", "ms", lambda rs: _ms(p50_p99(s for r in rs for s in r["connect_s"])[0]))],
        "pg": [("write->notified p50", "ms", lambda rs: _ms(p50_p99(s for r in rs for s in r["notified_s"])[0])),
               ("write->notified p99", "ms", lambda rs: _ms(p50_p99(s for r in rs for s in r["notified_s"])[1])),
               ("write commit p50", "ms", lambda rs: _ms(p50_p99(s for r in rs for s in r["write_s"])[0])),
               ("connect p50", "ms", lambda rs: _ms(p50_p99(s for r in rs for s in r["connect_s"])[0]))],
    }
    rows = []
    for engine, items in measures.items():
        for placement in dict.fromkeys(b["placement"] for b in blocks):
            for name, unit, f in items:
                values = {c: f(pick(engine, placement, c)) for c in CONFIGS}
                rows.append({"engine": engine, "placement": placement, "measure": name, "unit": unit, **values,
                             "ratio": values["secured"] / values["open"] if values["open"] else None})
    return rows


def run(a: argparse.Namespace) -> dict:
    from tests.hosts.fleet import Placed
    from tests.support.hosts import Lab

    placements = [p for p in a.placements.split(",") if p]
    unknown = set(placements) - {"loopback", "lab"}
    if unknown or not placements:
        raise SystemExit(f"--placements {a.placements!r}: each one of loopback, lab")
    blocks: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tether-secured-bench-") as tmpdir:
        tmp = Path(tmpdir)
        lab = Lab() if "lab" in placements else None
        try:
            with Placed(lab, tmp, hosts_in_certs=["127.0.0.1", "198.18.0.1", "198.18.0.2"]) as fleet:
                hosts = {p: (lab.host("srv"), lab.host("cli")) if p == "lab" else (_here(), _here())
                         for p in placements}
                with ThreadPoolExecutor(len(placements) * len(ROLES)) as pool:  # every server starts at once
                    futures = {(p, role): pool.submit(_serve_on, fleet, tmp, p, hosts[p][0], role)
                               for p in placements for role in ROLES}
                    urls = {p: {role: futures[p, role].result() for role in ROLES} for p in placements}
                workers = {p: _place(fleet, tmp, p, hosts[p][1], urls[p], a) for p in placements}
                for placement in placements:  # one short block of each first, not reported
                    for engine in ("nats", "pg"):
                        for config in CONFIGS:
                            _ask(workers[placement], engine, config, warm=True)
                say("warmed up: measuring")
                started = time.monotonic()
                for r in range(a.rounds):
                    order = placements if r % 2 == 0 else placements[::-1]
                    configs = CONFIGS if r % 2 == 0 else CONFIGS[::-1]
                    for placement in order:
                        for engine in ("nats", "pg"):
                            for config in configs:
                                result = _ask(workers[placement], engine, config)
                                blocks.append({"round": r, "placement": placement, "engine": engine,
                                               "config": config, "result": result})
                                brief = (f"{result['per_second']:.0f} transitions/s" if engine == "nats" else
                                         f"write->notified p50 {_ms(p50_p99(result['notified_s'])[0]):.2f} ms")
                                say(f"round {r + 1}/{a.rounds} {placement} {engine} {config}: {brief}")
                for worker in workers.values():
                    worker.stdin.write("quit\n")
                    worker.stdin.flush()
                    worker.wait(30)
                measured_s = time.monotonic() - started
        finally:
            if lab is not None:
                lab.close()
    return {"args": {k: v for k, v in vars(a).items() if k in ("rounds", "transitions", "pings", "writes",
                                                                "connects", "placements")},
            "cpus": os.cpu_count(), "measured_s": measured_s, "rows": summarize(blocks),
            "blocks": [block_summary(b) for b in blocks]}


def block_summary(block: dict) -> dict:
    """A block for the JSON: each list of latency samples as its count, p50 and p99 (the rows pool the samples)."""
    def short(v):
        if not isinstance(v, list):
            return v
        p50, p99 = p50_p99(v) if v else (0.0, 0.0)
        return {"n": len(v), "p50": p50, "p99": p99}
    return {**block, "result": {k: short(v) for k, v in block["result"].items()}}


def print_table(result: dict) -> None:
    print(f"{'engine':<6} {'placement':<9} {'measure':<20} {'unit':<4} {'open':>10} {'secured':>10} "
          f"{'secured/open':>12}")
    for row in result["rows"]:
        ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "-"
        print(f"{row['engine']:<6} {row['placement']:<9} {row['measure']:<20} {row['unit']:<4} "
              f"{row['open']:>10.2f} {row['secured']:>10.2f} {ratio:>12}")


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__, rounds=(6, "rounds; each runs every block once (order alternated)"))
    p.add_argument("--transitions", type=int, default=4000, help="transitions published per nats block")
    p.add_argument("--pings", type=int, default=300, help="one-at-a-time publishes per nats block (latency)")
    p.add_argument("--writes", type=int, default=80, help="registry writes per pg block")
    p.add_argument("--connects", type=int, default=5, help="new connections timed per block")
    p.add_argument("--placements", default="loopback,lab", help="loopback, lab (lab needs root)")
    p.add_argument("--serve", choices=ROLES, help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--host", help=argparse.SUPPRESS)
    p.add_argument("--creds", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--targets", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for name in ("rounds", "transitions", "pings", "writes", "connects"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.serve:
        return _serve(a)
    if a.worker:
        return asyncio.run(_worker(a))
    results = report(a.json, run(a), print_table)
    say(f"{results['measured_s']:.0f} s of measurement")
    return 0


if __name__ == "__main__":
    sys.exit(main())
