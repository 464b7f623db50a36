"""A local NATS cluster with JetStream: N `nats-server` processes on loopback, routed to each other.

    with NatsCluster(tmp_path / "nats", servers=3) as cluster:
        cluster.url            # "nats://127.0.0.1:P1,nats://127.0.0.1:P2,nats://127.0.0.1:P3"
        cluster.kill(1)        # SIGKILL server 1 (its store stays)
        cluster.restart(1)     # the same ports and store; waits until it is back in the cluster

Processes and addresses only: each server gets a free client port, cluster (route) port and monitoring
port, and its own `store_dir` under `directory`. `start()` returns once every server's `/healthz` answers
ok and JetStream's meta group has a leader (`/jsz`), so a stream can be created at once. The binary is
Debian's `/usr/sbin/nats-server` (or `nats-server` on PATH, or `$TETHER_NATS_SERVER`). Client and route
ports listen on `host` (or each server's own of `hosts`); the monitoring port always on 127.0.0.1.

Open (the default, loopback only) or secured, for a network:

    security = NatsSecurity(cert=lab / "nats-server.crt", key=lab / "nats-server.key", ca=lab / "ca.crt",
                            passwords={r: lab / "nats" / f"{r}.password" for r in ROLES})
    with NatsCluster(tmp / "nats", servers=3, hosts=["198.18.0.2", ...], security=security) as cluster:
        cluster.url                    # "tls://198.18.0.2:P1,..."
        cluster.auth("gateway")        # the NatsAuth a gateway connects with (bridge.experience.jetstream)

An open cluster on an address that is not loopback is refused unless `insecure=True`. Secured: TLS on
client connections and on routes (route TLS is mutual in nats-server: the server certificate must allow
clientAuth too), routes also authenticated by a shared route secret (so a lab client certificate alone
cannot join as a route; the secret is in the route URLs of the 0600 server configs, its bcrypt hash in
`cluster.authorization`), no anonymous users, one user per role with its bcrypt hash in the 0600 server
config and least privilege (`permissions`):

    admin     manages the stream (`$JS.API.>`): `start()` creates the experience stream as the admin, so no
              client role needs the right to create or change it (gateways and trainers wait for it)
    gateway   publishes `tether.experience.>`; stream info and message get (a moved session's last step,
              checking a duplicate PubAck); no consumer API: it cannot consume
    trainer   only its durable consumers (create/info/delete/next/ack), never the archiver's; never publishes
    archiver  only its durable consumers (`archiver_durables`), message get (gaps); never publishes
    every role subscribes to its own `_INBOX.<role>.>` only (the replies and deliveries to it).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bridge.common.lifecycle import Started
from bridge.common.net import is_loopback
from bridge.common.processes import free_port, spawn, stop_group
from bridge.experience.jetstream import MAX_MSG_BYTES, STREAM, SUBJECT_PREFIX, NatsAuth
from bridge.security.tokens import write_private

__all__ = ["ROLES", "NatsCluster", "NatsSecurity", "NatsStartError", "nats_server_binary", "permissions"]

_CLUSTER_NAME = "tether"
_STOP_GRACE_S = 5.0
ROLES = ("admin", "gateway", "trainer", "archiver")
_BCRYPT_COST = 11


class NatsStartError(RuntimeError):
    """A nats-server did not start, or the cluster did not become ready (the message names which and why)."""


def nats_server_binary() -> str | None:
    """The nats-server to run: `$TETHER_NATS_SERVER`, then `nats-server` on PATH, then /usr/sbin's; None if absent."""
    candidates = (os.environ.get("TETHER_NATS_SERVER"), shutil.which("nats-server"), "/usr/sbin/nats-server")
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def _free_port(host: str) -> int:
    """A free port on `host`; one free on loopback when `host` is not this namespace's (a server in another)."""
    try:
        return free_port(host)
    except OSError:
        return free_port()


_FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())"


@dataclass(frozen=True)
class _Ports:
    client: int
    cluster: int
    http: int


def _stop_all(procs: list[subprocess.Popen | None]) -> None:
    for proc in procs:
        if proc is not None:
            stop_group(proc, grace_s=_STOP_GRACE_S)


@dataclass(frozen=True, kw_only=True)
class NatsSecurity:
    """A secured cluster's files: the servers' certificate and key, the CA (clients verify the servers with it;
    routes verify each other), each role's 0600 password file (plaintext, the clients'), and optionally the
    routes' secret (default: generated once into the cluster directory, 0600)."""

    cert: Path
    key: Path
    ca: Path
    passwords: Mapping[str, Path]
    route_password_file: Path | None = None
    archiver_durables: tuple[str, ...] = ("tether-archive",)
    stream: str = STREAM

    def __post_init__(self):
        unknown = set(self.passwords) - set(ROLES)
        if unknown or "admin" not in self.passwords:
            raise ValueError(f"NATS roles {sorted(self.passwords)}: need 'admin' (creates the stream), others "
                             f"from {ROLES}; unknown: {sorted(unknown)}")
        for path in (self.cert, self.key, self.ca, *self.passwords.values()):
            if not Path(path).is_file():
                raise ValueError(f"NATS security file {path} does not exist")

    @classmethod
    def from_folder(cls, folder: Path | str) -> NatsSecurity:
        """The lab credentials folder's layout (`tether cluster certs`): nats-server.crt/.key, ca.crt,
        nats/<role>.password."""
        folder = Path(folder)
        return cls(cert=folder / "nats-server.crt", key=folder / "nats-server.key", ca=folder / "ca.crt",
                   passwords={r: folder / "nats" / f"{r}.password" for r in ROLES
                              if (folder / "nats" / f"{r}.password").is_file()})

    def auth(self, role: str) -> NatsAuth:
        """The credentials a client of `role` connects with."""
        if role not in self.passwords:
            raise KeyError(f"no NATS password file for role {role!r} (have {sorted(self.passwords)})")
        return NatsAuth(user=role, password_file=self.passwords[role], ca=self.ca)


def permissions(role: str, *, stream: str = STREAM, archiver_durables: Sequence[str] = ("tether-archive",)) -> dict:
    """nats-server `permissions` of `role` (least privilege; see the module docstring). The JetStream API
    subjects are those nats-py 2.16 sends (nats/js/manager.py, client.py) to nats-server 2.9+.

    >>> permissions("gateway")["subscribe"]
    {'allow': ['_INBOX.gateway.>']}
    """
    api = "$JS.API"

    def consumer_api(durable: str) -> list[str]:
        return [f"{api}.CONSUMER.INFO.{stream}.{durable}", f"{api}.CONSUMER.DELETE.{stream}.{durable}",
                f"{api}.CONSUMER.DURABLE.CREATE.{stream}.{durable}", f"{api}.CONSUMER.CREATE.{stream}.{durable}",
                f"{api}.CONSUMER.CREATE.{stream}.{durable}.>", f"{api}.CONSUMER.MSG.NEXT.{stream}.{durable}",
                f"$JS.ACK.{stream}.{durable}.>"]

    inbox = {"allow": [f"_INBOX.{role}.>"]}
    info, get = f"{api}.STREAM.INFO.{stream}", f"{api}.STREAM.MSG.GET.{stream}"
    if role == "admin":
        return {"publish": {"allow": [f"{api}.>"]}, "subscribe": inbox}
    if role == "gateway":
        return {"publish": {"allow": [f"{SUBJECT_PREFIX}.>", info, get]}, "subscribe": inbox}
    if role == "trainer":
        deny = [s for d in archiver_durables for s in consumer_api(d)]
        return {"publish": {"allow": [info, *consumer_api("*")], "deny": [f"{SUBJECT_PREFIX}.>", *deny]},
                "subscribe": inbox}
    if role == "archiver":
        allow = [info, get, *(s for d in archiver_durables for s in consumer_api(d))]
        return {"publish": {"allow": allow, "deny": [f"{SUBJECT_PREFIX}.>"]}, "subscribe": inbox}
    raise ValueError(f"unknown NATS role {role!r} (known: {ROLES})")


def _bcrypt(secret: str) -> str:
    import bcrypt

    return bcrypt.hashpw(secret.encode(), bcrypt.gensalt(_BCRYPT_COST, prefix=b"2a")).decode()


def _q(value: object) -> str:
    """A nats-server config value: JSON (quoted strings are taken literally: no `$VAR` expansion)."""
    return json.dumps(value)


class NatsCluster(Started):
    """`servers` routed nats-server processes with JetStream (see the module docstring). `hosts`: each server's
    client/route address (default `host` for all); `command_prefix(i)`: what server i runs under (e.g. `ip netns
    exec h1`; its monitoring port is then read through the same prefix)."""

    def __init__(self, directory: Path | str, *, servers: int = 3, host: str = "127.0.0.1",
                 hosts: Sequence[str] | None = None, security: NatsSecurity | None = None,
                 command_prefix: Callable[[int], Sequence[str]] | None = None, insecure: bool = False):
        if servers < 1:
            raise ValueError(f"servers must be >= 1, got {servers}")
        if hosts is not None and len(hosts) != servers:
            raise ValueError(f"{len(hosts)} hosts for {servers} servers")
        self.directory = Path(directory)
        self.host = host
        self.hosts = list(hosts) if hosts is not None else [host] * servers
        if security is None:  # open: anyone who reaches it reads and writes experience; loopback only by default
            exposed = [h for h in dict.fromkeys(self.hosts) if not is_loopback(h)]
            if exposed and not insecure:
                raise ValueError(f"an open NATS cluster (no TLS, no users) on {exposed}, not loopback: give "
                                 "security=NatsSecurity(...) (tether cluster certs), or insecure=True")
        self.servers, self.security, self.command_prefix = servers, security, command_prefix
        ports: set[int] = set()
        chosen: list[_Ports] = []
        while len(chosen) < servers:
            bind = self.hosts[len(chosen)]
            trio = [_free_port(bind), _free_port(bind), free_port()]
            if len(set(trio)) == 3 and not ports.intersection(trio):
                ports.update(trio)
                chosen.append(_Ports(*trio))
        self._ports = chosen
        self._procs: list[subprocess.Popen | None] = [None] * servers
        self._finalizer: weakref.finalize | None = None
        self._hashes: dict[str, str] = {}
        self._route_secret = ""

    scheme = property(lambda self: "tls" if self.security is not None else "nats")
    urls = property(lambda self: [f"{self.scheme}://{h}:{p.client}" for h, p in zip(self.hosts, self._ports,
                                                                                     strict=True)])
    url = property(lambda self: ",".join(self.urls))

    def auth(self, role: str) -> NatsAuth | None:
        """The credentials a client of `role` connects with (None: an open cluster needs none)."""
        return None if self.security is None else self.security.auth(role)

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
        p, host = self._ports[i], self.hosts[i]
        sec = self.security
        userinfo = f"route:{self._route_secret}@" if sec is not None else ""
        routes = ", ".join(_q(f"nats-route://{userinfo}{h}:{q.cluster}")
                           for j, (h, q) in enumerate(zip(self.hosts, self._ports, strict=True)) if j != i)
        tls = "" if sec is None else (f"tls {{\n  cert_file: {_q(str(sec.cert))}\n  key_file: {_q(str(sec.key))}\n"
                                      f"  ca_file: {_q(str(sec.ca))}\n  timeout: 2\n}}\n")
        route_auth = "" if sec is None else ("  " + tls.replace("\n", "\n  ").rstrip() + "\n  authorization {\n"
                                             f"    user: route\n    password: {_q(self._hashes['route'])}\n"
                                             "    timeout: 2\n  }\n")
        cluster = "" if self.servers == 1 else (
            f"cluster {{\n  name: {_CLUSTER_NAME}\n  listen: {_q(f'{host}:{p.cluster}')}\n  routes: [{routes}]\n"
            f"{route_auth}}}\n")
        auth = ""
        if sec is not None:
            users = [{"user": role, "password": self._hashes[role],
                      "permissions": permissions(role, stream=sec.stream, archiver_durables=sec.archiver_durables)}
                     for role in sec.passwords]
            auth = f"authorization {{\n  timeout: 2\n  users: {json.dumps(users, indent=2)}\n}}\n"
        text = (f"server_name: {self.name(i)}\nlisten: {_q(f'{host}:{p.client}')}\nhttp: \"127.0.0.1:{p.http}\"\n"
                f"max_payload: {MAX_MSG_BYTES}\n{tls}{auth}"
                f"jetstream {{\n  store_dir: {_q(str(self.store_dir(i)))}\n}}\n{cluster}")
        path = self.directory / self.name(i) / "nats.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, text.encode())  # 0600: password hashes and the route secret
        return path

    def _prepare_security(self) -> None:
        """Hash each role's password (bcrypt) and the routes' secret once per cluster start."""
        sec = self.security
        if sec is None or self._hashes:
            return
        for role, path in sec.passwords.items():
            self._hashes[role] = _bcrypt(NatsAuth(user=role, password_file=path).password())
        route_file = sec.route_password_file or self.directory / "route.password"
        if not route_file.is_file():
            route_file.parent.mkdir(parents=True, exist_ok=True)
            write_private(route_file, secrets.token_urlsafe(32).encode())
        self._route_secret = NatsAuth(user="route", password_file=route_file).password()
        if not all(c.isalnum() or c in "-_" for c in self._route_secret):
            raise ValueError(f"route secret in {route_file} must be [A-Za-z0-9_-] (it goes into route URLs)")
        self._hashes["route"] = _bcrypt(self._route_secret)

    def create_stream(self, *, replicas: int | None = None, duplicate_window_s: float | None = None,
                      timeout_s: float = 30.0) -> None:
        """Create (or bring up to date) the experience stream as the admin: replicas min(3, servers), max_msg_size
        MAX_MSG_BYTES. `start()` calls it for a secured cluster (client roles may not create streams)."""
        from bridge.experience.jetstream import DUPLICATE_WINDOW_S, connect, ensure_stream

        stream = self.security.stream if self.security is not None else STREAM

        async def go() -> None:
            nc = await connect(self.urls, name="tether-nats-admin", auth=self.auth("admin"))
            try:
                await ensure_stream(nc.jetstream(timeout=5.0), stream=stream, timeout_s=timeout_s,
                                    replicas=replicas or min(3, self.servers),
                                    duplicate_window_s=duplicate_window_s or DUPLICATE_WINDOW_S)
            finally:
                await nc.close()

        with ThreadPoolExecutor(1, thread_name_prefix="nats-create-stream") as pool:  # callers may be in a loop
            failed = pool.submit(asyncio.run, go()).exception()
        if failed is not None:
            raise NatsStartError(f"NATS cluster in {self.directory}: the admin could not create stream {stream}: "
                                 f"{failed}")

    def _spawn(self, i: int) -> None:
        binary = nats_server_binary()
        if binary is None:
            raise NatsStartError("nats-server not found (apt-get install nats-server, or set $TETHER_NATS_SERVER)")
        config = self._config(i)
        with open(self.log_path(i), "ab") as log:
            prefix = list(self.command_prefix(i)) if self.command_prefix is not None else []
            self._procs[i] = spawn([*prefix, binary, "-c", str(config)], death_signal=signal.SIGKILL,
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        if self._finalizer is None:
            self._finalizer = weakref.finalize(self, _stop_all, self._procs)

    def start(self, timeout: float = 30.0) -> None:
        """Start every server; return when all are healthy and the JetStream meta group has a leader."""
        if any(proc is not None for proc in self._procs):
            raise NatsStartError(f"cluster in {self.directory} already started")
        self._prepare_security()
        for i in range(self.servers):
            self._spawn(i)
        try:
            self._wait(range(self.servers), timeout)
            if self.security is not None:
                self.create_stream()
        except (NatsStartError, OSError):
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
            stop_group(self._procs[i], grace_s=_STOP_GRACE_S)
            self._procs[i] = None
        self._spawn(i)
        self._wait([i], timeout)

    def stop(self) -> None:
        """SIGTERM every server (SIGKILL after a grace period); idempotent."""
        _stop_all(self._procs)
        for i in range(self.servers):
            self._procs[i] = None

    def monitor(self, i: int, path: str) -> dict:
        """Server i's monitoring endpoint `path` (e.g. "jsz", "varz") as JSON (on 127.0.0.1 only)."""
        url = f"http://127.0.0.1:{self._ports[i].http}/{path}"
        if self.command_prefix is None:
            with urllib.request.urlopen(url, timeout=2) as response:
                return json.load(response)
        try:  # the server's own loopback: read from inside its prefix (e.g. its network namespace)
            out = subprocess.run([*self.command_prefix(i), sys.executable, "-c", _FETCH, url], capture_output=True,
                                 timeout=5, check=True).stdout
        except (subprocess.SubprocessError, OSError) as exc:
            raise OSError(f"monitor {url} of {self.name(i)}: {exc}") from None
        return json.loads(out)

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
