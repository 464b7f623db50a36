"""A local NATS cluster with JetStream: N `nats-server` processes on loopback, routed to each other.

    with NatsCluster(tmp_path / "nats", servers=3) as cluster:
        cluster.url            # "nats://127.0.0.1:P1,nats://127.0.0.1:P2,nats://127.0.0.1:P3"
        cluster.kill(1)        # SIGKILL server 1 (its store stays)
        cluster.restart(1)     # the same ports and store; waits until it is back in the cluster

Processes and addresses only: each server gets a free loopback client port, cluster (route) port and
monitoring port, and its own `store_dir` under `directory`. `start()` returns once every server's
`/healthz` answers ok and JetStream's meta group has a leader (`/jsz`), so a stream can be created at
once. The binary is Debian's `/usr/sbin/nats-server` (or `nats-server` on PATH, or `$TETHER_NATS_SERVER`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import weakref
from dataclasses import dataclass
from pathlib import Path

from bridge.common.processes import parent_death_signal

__all__ = ["NatsCluster", "NatsStartError", "nats_server_binary"]

_CLUSTER_NAME = "tether"
_STOP_GRACE_S = 5.0


class NatsStartError(RuntimeError):
    """A nats-server did not start, or the cluster did not become ready (the message names which and why)."""


def nats_server_binary() -> str | None:
    """The nats-server to run: `$TETHER_NATS_SERVER`, then `nats-server` on PATH, then /usr/sbin's; None if absent."""
    for candidate in (os.environ.get("TETHER_NATS_SERVER"), shutil.which("nats-server"), "/usr/sbin/nats-server"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class _Ports:
    client: int
    cluster: int
    http: int


def _stop(proc: subprocess.Popen, grace: float = _STOP_GRACE_S) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _stop_all(procs: list[subprocess.Popen | None]) -> None:
    for proc in procs:
        if proc is not None:
            _stop(proc)


class NatsCluster:
    """`servers` routed nats-server processes with JetStream on 127.0.0.1 (see the module docstring)."""

    def __init__(self, directory: Path | str, *, servers: int = 3, host: str = "127.0.0.1"):
        if servers < 1:
            raise ValueError(f"servers must be >= 1, got {servers}")
        self.directory = Path(directory)
        self.host = host
        self.servers = servers
        ports: set[int] = set()
        chosen: list[_Ports] = []
        while len(chosen) < servers:
            trio = [_free_port(host) for _ in range(3)]
            if len(set(trio)) == 3 and not ports.intersection(trio):
                ports.update(trio)
                chosen.append(_Ports(*trio))
        self._ports = chosen
        self._procs: list[subprocess.Popen | None] = [None] * servers
        self._finalizer: weakref.finalize | None = None

    urls = property(lambda self: [f"nats://{self.host}:{p.client}" for p in self._ports])
    url = property(lambda self: ",".join(self.urls))

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def name(self, i: int) -> str:
        """Server i's `server_name` (what JetStream reports as a stream's leader or replica)."""
        return f"n{i}"

    def index(self, name: str) -> int:
        """The index of the server called `name` (e.g. a stream's `cluster.leader`)."""
        for i in range(self.servers):
            if self.name(i) == name:
                return i
        raise KeyError(f"no server named {name!r} in this cluster ({[self.name(i) for i in range(self.servers)]})")

    def store_dir(self, i: int) -> Path:
        return self.directory / self.name(i) / "store"

    def log_path(self, i: int) -> Path:
        return self.directory / self.name(i) / "nats-server.log"

    def pid(self, i: int) -> int | None:
        proc = self._procs[i]
        return proc.pid if proc is not None and proc.poll() is None else None

    def _config(self, i: int) -> Path:
        p = self._ports[i]
        routes = ", ".join(f'"nats-route://{self.host}:{q.cluster}"' for j, q in enumerate(self._ports) if j != i)
        cluster = "" if self.servers == 1 else (
            f"cluster {{\n  name: {_CLUSTER_NAME}\n  listen: \"{self.host}:{p.cluster}\"\n  routes: [{routes}]\n}}\n")
        text = (f"server_name: {self.name(i)}\nlisten: \"{self.host}:{p.client}\"\nhttp: \"{self.host}:{p.http}\"\n"
                f"jetstream {{\n  store_dir: \"{self.store_dir(i)}\"\n}}\n{cluster}")
        path = self.directory / self.name(i) / "nats.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def _spawn(self, i: int) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise NatsStartError("nats-server not found (apt-get install nats-server, or set $TETHER_NATS_SERVER)")
        config = self._config(i)
        with open(self.log_path(i), "ab") as log:
            self._procs[i] = subprocess.Popen([binary, "-c", str(config)], stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True,
                                              preexec_fn=parent_death_signal(signal.SIGKILL, main_thread_only=True))
        if self._finalizer is None:
            self._finalizer = weakref.finalize(self, _stop_all, self._procs)

    def start(self, timeout: float = 30.0) -> None:
        """Start every server; return when all are healthy and the JetStream meta group has a leader."""
        if any(proc is not None for proc in self._procs):
            raise NatsStartError(f"cluster in {self.directory} already started")
        for i in range(self.servers):
            self._spawn(i)
        try:
            self._wait(range(self.servers), timeout)
        except NatsStartError:
            self.stop()
            raise

    def kill(self, i: int) -> None:
        """SIGKILL server i (no clean shutdown; its store stays for `restart(i)`)."""
        proc = self._procs[i]
        if proc is None:
            raise NatsStartError(f"server {self.name(i)} is not running")
        proc.kill()
        proc.wait()
        self._procs[i] = None

    def restart(self, i: int, timeout: float = 30.0) -> None:
        """Start server i again (stopping it first if running), same ports and store; wait until ready."""
        if self._procs[i] is not None:
            _stop(self._procs[i])
            self._procs[i] = None
        self._spawn(i)
        self._wait([i], timeout)

    def stop(self) -> None:
        """SIGTERM every server (SIGKILL after a grace period); idempotent."""
        _stop_all(self._procs)
        for i in range(self.servers):
            self._procs[i] = None

    def monitor(self, i: int, path: str) -> dict:
        """Server i's monitoring endpoint `path` (e.g. "jsz", "varz") as JSON."""
        url = f"http://{self.host}:{self._ports[i].http}/{path}"
        with urllib.request.urlopen(url, timeout=2) as response:
            return json.load(response)

    def meta_leader(self) -> str | None:
        """The JetStream meta leader's server name, as the first live server reports it; None if none yet."""
        for i in range(self.servers):
            if self.pid(i) is None:
                continue
            try:
                cluster = self.monitor(i, "jsz").get("meta_cluster") or {}
            except (OSError, ValueError):
                continue
            if self.servers == 1:
                return self.name(i)
            if cluster.get("leader"):
                return str(cluster["leader"])
        return None

    def _healthy(self, i: int) -> bool:
        try:
            return self.monitor(i, "healthz").get("status") == "ok"
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def _wait(self, which, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(which)
        while pending or self.meta_leader() is None:
            for i in list(pending):
                proc = self._procs[i]
                if proc is None or proc.poll() is not None:
                    code = None if proc is None else proc.returncode
                    raise NatsStartError(f"nats-server {self.name(i)} exited ({code}) before it was ready; "
                                         f"log {self.log_path(i)}:\n{self._log_tail(i)}")
                if self._healthy(i):
                    pending.remove(i)
            if time.monotonic() > deadline:
                names = [self.name(i) for i in pending]
                what = f"servers {names} not healthy" if pending else "no JetStream meta leader"
                raise NatsStartError(f"NATS cluster in {self.directory}: {what} after {timeout:g} s")
            time.sleep(0.05)

    def _log_tail(self, i: int, chars: int = 2000) -> str:
        try:
            return self.log_path(i).read_text(errors="replace")[-chars:]
        except OSError:
            return ""
