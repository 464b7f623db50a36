"""One PostgreSQL server in a folder: for tests, `tether cluster up` and local fleets.

Secured (what `tether cluster up` runs): scram-sha-256 for every connection, TCP over TLS only, and a
least-privilege role for gateways:

    with PostgresServer(d, tls_cert=crt, tls_key=key, tls_ca=ca, listen="198.18.0.3") as pg:
        url, passfile = pg.client("gateway")   # postgresql://tether_gateway@198.18.0.3:PORT/tether?sslmode=verify-full&
                                               # sslrootcert=/creds/ca.crt, and its libpq passfile (--registry-passfile)
        registry = Registry(pg.url)            # the gateway role's URL with its passfile in it (libpq's `passfile`)
        pg.admin_url                           # the superuser's (`tether`): admin steps only, never a gateway's

Trust (loopback only; tests that need no credentials):

    with PostgresServer(tmp_path / "pg") as pg:          # initdb (first time), postgres, createdb tether
        registry = Registry(pg.url)                      # postgresql://tether@127.0.0.1:PORT/tether
        pg.kill()                                        # SIGKILL the postmaster (a crash)
        pg.start()                                       # same folder, same port, same data
        pg.restart()                                     # stop() then start()

Secured mode: `initdb --auth-local=scram-sha-256 --auth-host=scram-sha-256 --pwfile` (the admin's generated password,
from a file that exists only while initdb runs: never in argv), password_encryption=scram-sha-256, ssl=on with the
given certificate and key (copied into the folder, the key 0600 and owned by the server's user, as PostgreSQL
requires), and a pg_hba.conf admitting the socket and `hostssl` connections with scram-sha-256 only: TCP without TLS
is refused ("no pg_hba.conf entry ... no encryption"), a client without the password too ("password authentication
failed"). At every start, as the admin: the gateway role (tether_gateway) created or reset with the password of its
passfile, the registry's schema migrated and the role granted exactly what a gateway uses
(bridge.registry.roles.prepare). Passfiles (`*:*:*:USER:PASSWORD`, 0600): `admin_passfile` / `gateway_passfile`
(made there when missing; `tether cluster certs` makes them), else admin.pgpass / gateway.pgpass in the folder.

Both modes: `fsync=off` (a process crash loses nothing committed; a machine crash may: a local server), the socket
folder 0700, `listen` the one address it binds (trust mode: loopback only). `prefix` runs the server under a command,
e.g. `ip netns exec HOST` (its socket, a file, is still reached from here: readiness and admin steps use it).

Run as root, the server runs as the `postgres` user (PostgreSQL refuses root) with no capabilities at all (setpriv:
empty bounding and inheritable sets, no-new-privs), so even a superuser's `COPY ... TO PROGRAM` runs as plain
`postgres`. Its data, socket and TLS copies are owned by `postgres` (0700; the log and passfiles stay root's, in the
folder). Where `postgres` cannot enter the folder (pytest's 0700 /tmp/pytest-of-root, root's home), those files go to
a folder of their own under /var/tmp/tether-postgres (root's, 0711: entered, not listed), linked as `folder/server`
and removed at a later start once the folder is gone. Chosen over: ambient CAP_DAC_OVERRIDE (the server, and any
superuser session through it, could read and write every file on the machine); opening the folders above to
`postgres` (chmod or an ACL entry: pytest sets its base folder back to 0700 at every session, which cut off a running
server mid-initdb here, and root's home is not ours to open).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import urllib.parse
import weakref
from collections.abc import Sequence
from pathlib import Path

from bridge.common.lifecycle import Started
from bridge.common.net import is_loopback
from bridge.common.processes import free_port, kill_with_children, spawn, stop_group

__all__ = ["ROLES", "PostgresServer", "PostgresStartError", "postgres_bin_dir"]

_USER = "tether"          # the bootstrap superuser: the admin
_DATABASE = "tether"
ROLES = {"admin": _USER, "gateway": "tether_gateway"}   # client(role) -> the database user it logs in as
_SERVER_USER = "postgres"


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
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),  # the newest major version last
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    return found[-1].parent if found else None


class PostgresServer(Started):
    """A PostgreSQL server whose data, socket and log live under `directory`; `port=0` picks a free one (kept across
    restarts, so `url` stays valid). Secured when `tls_cert` and `tls_key` are given (see the module docstring)."""

    def __init__(self, directory: Path | str, *, port: int = 0, listen: str = "127.0.0.1",
                 settings: dict[str, str] | None = None, tls_cert: Path | str | None = None,
                 tls_key: Path | str | None = None, tls_ca: Path | str | None = None,
                 admin_passfile: Path | str | None = None, gateway_passfile: Path | str | None = None,
                 prefix: Sequence[str] = ()):
        self.directory = Path(directory)
        self.port = port or free_port()
        if (tls_cert is None) != (tls_key is None):
            raise ValueError(f"TLS needs both tls_cert and tls_key, got cert={tls_cert} key={tls_key}")
        self.secured = tls_cert is not None
        if not self.secured and not is_loopback(listen):
            raise ValueError(f"listen address {listen!r} is not loopback: without tls_cert/tls_key the server trusts "
                             "every connection, so it listens on loopback only")
        if not self.secured and (tls_ca or admin_passfile or gateway_passfile):
            raise ValueError("tls_ca and passfiles belong to the secured mode: give tls_cert and tls_key too")
        self.listen = listen
        self.tls_cert, self.tls_key = (Path(p) if p is not None else None for p in (tls_cert, tls_key))
        self.tls_ca = Path(tls_ca) if tls_ca is not None else None
        self.passfiles = {"admin": Path(admin_passfile or self.directory / "admin.pgpass"),
                          "gateway": Path(gateway_passfile or self.directory / "gateway.pgpass")}
        self.prefix = tuple(prefix)
        self.settings = {"fsync": "off", "max_connections": "200", **(settings or {})}
        self._proc: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None  # stops the server should this object be dropped or exit

    data_dir = property(lambda self: self.server_root / "data")
    socket_dir = property(lambda self: self.server_root / "socket")
    tls_dir = property(lambda self: self.server_root / "tls")
    log_path = property(lambda self: self.directory / "postgres.log")

    @property
    def server_root(self) -> Path:
        """Where the server's own files (data, socket, TLS copies) are: `directory`, or the folder its `server`
        link names (run as root with `directory` where the postgres user cannot reach: see the module docstring)."""
        link = self.directory / "server"
        return link.resolve() if link.is_symlink() else self.directory
    pid = property(lambda self: self._proc.pid if self._proc is not None else None)

    @property
    def host(self) -> str:
        """The address clients use: `listen`, or 127.0.0.1 when it listens on every address."""
        return "127.0.0.1" if self.listen in ("*", "0.0.0.0", "::") else self.listen

    def client(self, role: str = "admin") -> tuple[str, Path | None]:
        """(URL, passfile) for a client logging in as `role` ("admin" or "gateway"): the URL carries no password
        (verify-full against `tls_ca` when given, else sslmode=require); give the passfile with --registry-passfile.
        Trust mode: (the URL, None) for the admin only."""
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        host = f"[{self.host}]" if ":" in self.host else self.host
        base = f"postgresql://{ROLES[role]}@{host}:{self.port}/{_DATABASE}"
        if not self.secured:
            if role != "admin":
                raise ValueError(f"a trust-mode server has no {role} role: give tls_cert and tls_key (secured mode)")
            return base, None
        query = {"sslmode": "verify-full", "sslrootcert": str(self.tls_ca.resolve())} if self.tls_ca else \
            {"sslmode": "require"}
        return f"{base}?{urllib.parse.urlencode(query)}", self.passfiles[role].resolve()

    @property
    def url(self) -> str:
        """What a gateway's --registry gets: trust mode the admin's URL; secured the gateway role's, passfile in it."""
        return self._with_passfile("gateway") if self.secured else self.client("admin")[0]

    @property
    def admin_url(self) -> str:
        """The superuser's URL (secured: its passfile in it): migrations, grants, tests that look inside."""
        return self._with_passfile("admin")

    def _with_passfile(self, role: str) -> str:
        from bridge.registry.backends import with_passfile

        url, passfile = self.client(role)
        return with_passfile(url, passfile) if passfile is not None else url

    def __repr__(self) -> str:
        mode = "secured" if self.secured else "trust"
        return (f"PostgresServer({str(self.directory)!r}, {mode}, listen={self.listen}, port={self.port}, "
                f"pid={self.pid})")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        """initdb on first use, start `postgres` and block until it accepts connections; createdb tether; secured:
        the gateway role, the schema and the grants (bridge.registry.roles.prepare)."""
        if self.running:
            raise PostgresStartError(f"PostgreSQL already running (pid {self.pid}) on port {self.port}")
        bin_dir = postgres_bin_dir()
        if bin_dir is None or not (bin_dir / "postgres").exists():
            raise PostgresStartError("no PostgreSQL found: install it (Debian: postgresql) or set TETHER_POSTGRES_BIN")
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0 and not self.directory.joinpath("server").is_symlink() and \
                not _reachable(self.directory.resolve(), pwd.getpwnam(_SERVER_USER)):
            _collect_garbage()
            _place_outside(self.directory)
        self._check_mode()
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self.socket_dir.chmod(0o700)
        self._own(self.socket_dir)
        self.log_path.touch(mode=0o600, exist_ok=True)
        self.log_path.chmod(0o600)
        args = [str(bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                "-c", f"listen_addresses={self.listen}", "-c", f"unix_socket_directories={self.socket_dir}",
                "-c", "unix_socket_permissions=0700"]
        if self.secured:
            self._ensure_passfiles()
            for key, value in self._install_tls().items():
                args += ["-c", f"{key}={value}"]
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(bin_dir)
        if self.secured:
            self._write_hba()
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        deadline = time.monotonic() + timeout
        while True:  # a killed postmaster's backends may hold its shared memory a moment: retry until they are gone
            with open(self.log_path, "ab") as log:
                self._proc = spawn([*self.prefix, *self._as_owner(args)], death_signal=signal.SIGINT,
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            self._finalizer = weakref.finalize(self, _shutdown, self._proc)
            if self._wait_ready(deadline):
                break
            if time.monotonic() >= deadline:
                self._reap()
                raise PostgresStartError(f"PostgreSQL did not accept connections on port {self.port} within "
                                         f"{timeout:.0f} s; log {self.log_path}:\n{self._log_tail()}")
            time.sleep(0.2)
        self._createdb()
        if self.secured:
            from bridge.registry.roles import prepare

            prepare(self._local_admin_url(), gateway_passfile=self.passfiles["gateway"], role=ROLES["gateway"])

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT: roll back open transactions, checkpoint); SIGKILL after `timeout`."""
        if self._proc is None:
            return
        stop_group(self._proc, grace_s=timeout, sig=signal.SIGINT)
        self._reap()

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends at once, as a crash of its host would: once it returns nothing
        answers. (Each backend leads its own session, out of the postmaster's process group; a postmaster killed
        alone leaves backends that serve, and commit, a query or two before they notice.) `start()` recovers."""
        if self._proc is None:
            return
        kill_with_children(self._proc)
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

    def _socket_connect(self, dbname: str, **kwargs):
        """The admin over the server's socket (reached from here whatever the network namespace)."""
        import psycopg

        passfile = str(self.passfiles["admin"].resolve()) if self.secured else None
        return psycopg.connect(host=str(self.socket_dir), port=self.port, user=_USER, dbname=dbname,
                               passfile=passfile, **kwargs)

    def _local_admin_url(self) -> str:
        query = {"host": str(self.socket_dir), "port": str(self.port),
                 "passfile": str(self.passfiles["admin"].resolve())}
        return f"postgresql://{_USER}@/{_DATABASE}?{urllib.parse.urlencode(query)}"

    def _wait_ready(self, deadline: float) -> bool:
        """True once a connection succeeds; False if the postmaster exited (e.g. shared memory still held)."""
        import psycopg

        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                self._socket_connect("postgres", connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        return False

    def _check_mode(self) -> None:
        """A folder keeps the mode it was made in (a trust cluster has no admin password to switch to scram)."""
        marker = self.directory / "auth"
        mode = "scram-sha-256" if self.secured else "trust"
        if (self.data_dir / "PG_VERSION").exists():
            made = marker.read_text().strip() if marker.exists() else "trust"
            if made != mode:
                raise PostgresStartError(f"{self.directory} holds a cluster made with {made} authentication; "
                                         f"this server wants {mode}: use a new folder")
        else:
            marker.write_text(mode + "\n")

    def _ensure_passfiles(self) -> None:
        from bridge.registry.roles import read_passfile, write_passfile

        for role, path in self.passfiles.items():
            if path.exists():
                user = read_passfile(path)[0]
                if user != ROLES[role]:
                    raise PostgresStartError(f"passfile {path} is for user {user!r}; the {role} is {ROLES[role]!r}")
            elif role == "admin" and (self.data_dir / "PG_VERSION").exists():
                raise PostgresStartError(f"the admin passfile {path} of the cluster in {self.data_dir} is missing")
            else:
                write_passfile(path, ROLES[role])

    def _install_tls(self) -> dict[str, str]:
        """The certificate and key copied where the server's user owns them (key 0600): the ssl settings."""
        self.tls_dir.mkdir(mode=0o700, exist_ok=True)
        self._own(self.tls_dir)
        crt, key = self.tls_dir / "server.crt", self.tls_dir / "server.key"
        for source, target, mode in ((self.tls_cert, crt, 0o644), (self.tls_key, key, 0o600)):
            try:
                data = source.read_bytes()
            except OSError as exc:
                raise PostgresStartError(f"cannot read the TLS file {source}: {exc.strerror}") from None
            target.unlink(missing_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self._own(target)
        return {"ssl": "on", "ssl_cert_file": str(crt), "ssl_key_file": str(key),
                "ssl_min_protocol_version": "TLSv1.2", "password_encryption": "scram-sha-256"}

    def _write_hba(self) -> None:
        hba = self.data_dir / "pg_hba.conf"
        hba.write_text("# tether (secured): the socket and TLS only, scram-sha-256 only; no trust, no plain TCP\n"
                       "local   all  all        scram-sha-256\n"
                       "hostssl all  all  all   scram-sha-256\n")
        hba.chmod(0o600)
        self._own(hba)

    def _initdb(self, bin_dir: Path) -> None:
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)  # a half-made cluster from an interrupted initdb
        self.data_dir.mkdir(mode=0o700)
        self._own(self.data_dir)
        args = [str(bin_dir / "initdb"), "-D", str(self.data_dir), f"-U{_USER}", "-EUTF8", "--no-sync", "--locale=C"]
        pwfile = self.server_root / f".initdb-{secrets.token_hex(4)}"
        try:
            if self.secured:
                from bridge.registry.roles import read_passfile

                fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(read_passfile(self.passfiles["admin"])[1] + "\n")
                self._own(pwfile)
                args += ["--auth-local=scram-sha-256", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
            else:
                args.append("--auth=trust")
            done = subprocess.run(self._as_owner(args), stdin=subprocess.DEVNULL, capture_output=True, text=True)
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode != 0:
            raise PostgresStartError(f"initdb -D {self.data_dir} failed ({done.returncode}):\n{done.stderr[-2000:]}")

    def _createdb(self) -> None:
        with self._socket_connect("postgres", autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (_DATABASE,)).fetchone() is None:
                conn.execute(f"CREATE DATABASE {_DATABASE}")

    def _log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    # PostgreSQL refuses to run as root: as root, run it as `postgres` with no capabilities left at all.
    def _as_owner(self, args: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return args
        return ["setpriv", f"--reuid={_SERVER_USER}", f"--regid={_SERVER_USER}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--pdeathsig=keep", *args]

    def _own(self, path: Path) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam(_SERVER_USER)
            os.chown(path, user.pw_uid, user.pw_gid)


# -- the server's own files where the postgres user can reach them ----------------------------------------------

RUNTIME = Path("/var/tmp/tether-postgres")   # root's, 0711: entered by postgres, listed by nobody else


def _reachable(folder: Path, user: pwd.struct_passwd) -> bool:
    """Whether `user` (its own group only: the server runs with --clear-groups) may enter `folder`."""
    for path in (folder, *folder.parents):
        if not path.exists():
            continue
        st = path.stat()
        bit = 0o100 if st.st_uid == user.pw_uid else 0o010 if st.st_gid == user.pw_gid else 0o001
        if not st.st_mode & bit:
            return False
    return True


def _place_outside(directory: Path) -> Path:
    """A new folder under RUNTIME for the server's files, linked from `directory`/server; it records its owner."""
    RUNTIME.mkdir(mode=0o711, parents=True, exist_ok=True)
    st = RUNTIME.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:  # /var/tmp is everyone's: someone else's folder is not ours
        raise PostgresStartError(f"{RUNTIME} is not a folder owned by root: remove it (someone else made it)")
    RUNTIME.chmod(0o711)
    root = Path(tempfile.mkdtemp(prefix="pg-", dir=RUNTIME))
    root.chmod(0o711)
    (root / "owner").write_text(str(directory.resolve()) + "\n")
    (directory / "server").symlink_to(root, target_is_directory=True)
    return root


def _collect_garbage() -> None:
    """Remove RUNTIME folders whose owner folder is gone (a test's tmp_path deleted) and whose server is not running."""
    if not RUNTIME.is_dir():
        return
    for root in RUNTIME.iterdir():
        try:
            owner = Path((root / "owner").read_text().strip())
            link = owner / "server"
            if link.is_symlink() and link.resolve() == root.resolve():
                continue
            pid_file = root / "data" / "postmaster.pid"
            if pid_file.exists() and Path(f"/proc/{pid_file.read_text().split()[0]}").exists():
                continue
        except (OSError, IndexError):
            continue
        shutil.rmtree(root, ignore_errors=True)


def _shutdown(proc: subprocess.Popen) -> None:
    """At interpreter exit (or when the PostgresServer is dropped): a fast shutdown, SIGKILL if it hangs."""
    stop_group(proc, grace_s=10, sig=signal.SIGINT)
