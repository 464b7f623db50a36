"""One PostgreSQL server in a folder, on a loopback port: for tests, `tether cluster up` and local fleets.

    with PostgresServer(tmp_path / "pg") as pg:          # initdb (first time), postgres, createdb tether
        registry = Registry(pg.url)                      # postgresql://tether@127.0.0.1:PORT/tether
        pg.kill()                                        # SIGKILL the postmaster (a crash)
        pg.start()                                       # same folder, same port, same data
        pg.restart()                                     # stop() then start()

The cluster is made with `initdb --auth=trust -U tether` (loopback and a socket in the folder only),
`fsync=off` (a process crash loses nothing committed; a machine crash may: this is a local server).
Run as root, the server runs as the `postgres` user (PostgreSQL refuses root) with the capability to
reach a folder only root may enter.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
import weakref
from pathlib import Path

__all__ = ["PostgresServer", "PostgresStartError", "postgres_bin_dir"]

_USER = "tether"
_DATABASE = "tether"


class PostgresStartError(RuntimeError):
    """PostgreSQL could not be set up or started; the message carries the tail of its log."""


def postgres_bin_dir() -> Path | None:
    """The folder holding `initdb`, `postgres` and `pg_ctl`: $TETHER_POSTGRES_BIN, the PATH, or the newest
    /usr/lib/postgresql/*/bin (Debian keeps them off the PATH); None where none is installed."""
    env = os.environ.get("TETHER_POSTGRES_BIN")
    if env:
        return Path(env)
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: _major(p.parent.parent.name))
    return found[-1].parent if found else None


def _major(name: str) -> int:
    return int(name) if name.isdigit() else 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """A PostgreSQL server whose data, socket and log live under `directory`; `port=0` picks a free one
    (kept across restarts, so `url` stays valid)."""

    def __init__(self, directory: Path | str, *, port: int = 0, settings: dict[str, str] | None = None):
        self.directory = Path(directory)
        self.port = port or _free_port()
        self.settings = {"fsync": "off", "max_connections": "200", **(settings or {})}
        self._proc: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None  # stops the server should this object be dropped or exit

    data_dir = property(lambda self: self.directory / "data")
    socket_dir = property(lambda self: self.directory / "socket")
    log_path = property(lambda self: self.directory / "postgres.log")
    url = property(lambda self: f"postgresql://{_USER}@127.0.0.1:{self.port}/{_DATABASE}")
    pid = property(lambda self: self._proc.pid if self._proc is not None else None)

    def __enter__(self) -> PostgresServer:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"PostgresServer({str(self.directory)!r}, port={self.port}, pid={self.pid})"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        """initdb on first use, start `postgres` and block until it accepts connections; createdb tether."""
        if self.running:
            raise PostgresStartError(f"PostgreSQL already running (pid {self.pid}) on port {self.port}")
        bin_dir = postgres_bin_dir()
        if bin_dir is None or not (bin_dir / "postgres").exists():
            raise PostgresStartError("no PostgreSQL found: install it (Debian: postgresql) or set TETHER_POSTGRES_BIN")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        self._own(self.socket_dir)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(bin_dir)
        args = [str(bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.socket_dir}"]
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        deadline = time.monotonic() + timeout
        while True:  # a killed postmaster's backends may hold its shared memory a moment: retry until they are gone
            with open(self.log_path, "ab") as log:
                self._proc = subprocess.Popen(self._as_owner(args), stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True)
            self._finalizer = weakref.finalize(self, _shutdown, self._proc)
            if self._wait_ready(deadline):
                break
            if time.monotonic() >= deadline:
                self._reap()
                raise PostgresStartError(f"PostgreSQL did not accept connections on port {self.port} within "
                                         f"{timeout:.0f} s; log {self.log_path}:\n{self._log_tail()}")
            time.sleep(0.2)
        self._createdb()

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, checkpoint); SIGKILL after `timeout`."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGINT)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._reap()

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crash would; its backends notice and exit. `start()` recovers."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.kill()
        self._reap()

    def restart(self, timeout: float = 60.0) -> None:
        self.stop()
        self.start(timeout)

    def _reap(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._proc is not None:
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def _wait_ready(self, deadline: float) -> bool:
        """True once a connection succeeds; False if the postmaster exited (e.g. shared memory still held)."""
        import psycopg

        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                psycopg.connect(host="127.0.0.1", port=self.port, user=_USER, dbname="postgres",
                                connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        return False

    def _initdb(self, bin_dir: Path) -> None:
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)  # a half-made cluster from an interrupted initdb
        self.data_dir.mkdir(mode=0o700)
        self._own(self.data_dir)
        args = [str(bin_dir / "initdb"), "-D", str(self.data_dir), "--auth=trust", f"-U{_USER}", "-EUTF8",
                "--no-sync", "--locale=C"]
        done = subprocess.run(self._as_owner(args), stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            raise PostgresStartError(f"initdb -D {self.data_dir} failed ({done.returncode}):\n{done.stderr[-2000:]}")

    def _createdb(self) -> None:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=_USER, dbname="postgres",
                             autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (_DATABASE,)).fetchone() is None:
                conn.execute(f"CREATE DATABASE {_DATABASE}")

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    # PostgreSQL refuses to run as root: as root, run it as `postgres`, allowed to enter root's folders.
    def _as_owner(self, args: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return args
        caps = "+dac_override,+dac_read_search"
        return ["setpriv", "--reuid=postgres", "--regid=postgres", "--clear-groups", f"--inh-caps={caps}",
                f"--ambient-caps={caps}", *args]

    def _own(self, path: Path) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(path, user.pw_uid, user.pw_gid)


def _shutdown(proc: subprocess.Popen) -> None:
    """At interpreter exit (or when the PostgresServer is dropped): a fast shutdown, SIGKILL if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
