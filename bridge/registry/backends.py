"""Where the registry's rows live: one SQLite file (the embedded default) or a PostgreSQL database (a fleet of
gateways). The registry's logic (bridge.registry.store) is written once against this small role, in SQL both
engines accept (`?` placeholders, `ON CONFLICT`, `RETURNING`); a backend only connects, delimits transactions and
says when the data changed.

    backend = open_backend("runs/models/.tether/registry.sqlite")     # or "postgresql://tether@db:5432/tether"
    backend.begin()                                                    # a write transaction; writers take turns
    backend.execute("UPDATE versions SET state = ? WHERE policy = ? AND version = ?", ("live", "hopper", 3))
    backend.commit()                                                   # (or rollback())
    with backend.read():                                               # one consistent snapshot for several reads
        rows = backend.execute("SELECT * FROM versions WHERE policy = ?", ("hopper",)).fetchall()

Other modules that keep tables beside the registry's (session ownership, per-replica verification) get a plain
PostgreSQL connection from `connect(url)` and add their tables as numbered migrations (bridge.registry.migrations).

Credentials: a registry URL never carries a password. libpq reads it from a passfile (`*:*:*:USER:PASSWORD`, 0600):
`$PGPASSFILE`, or the one `with_passfile` names in the URL (`--registry-passfile`), so every connection made from
that URL (registry, ownership, replicas, follower, leader lock) finds it. Every URL a message shows goes through
`shown` (a password, should one be there anyway, masked).

    url = with_passfile("postgresql://tether_gateway@db:5432/tether?sslmode=verify-full&sslrootcert=ca.crt",
                        "creds/postgres/gateway.pgpass")      # ...&passfile=creds/postgres/gateway.pgpass
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from bridge.registry.errors import RegistryError, RegistryUnavailable

NOTIFY_CHANNEL = "tether_registry"   # NOTIFY tether_registry, '<epoch>' after every committed change
WRITE_LOCK_KEY = 7_461_636_801       # pg_advisory_xact_lock: one writer at a time, as SQLite's BEGIN IMMEDIATE
CONNECT_TIMEOUT_S = 2
# the server drops a connection whose client went silent (a partitioned or frozen gateway) within ~11 s, and with
# it that gateway's session-level locks (the leader lock); the client side gives up on unacknowledged sends in 5 s
SERVER_SIDE_KEEPALIVES = ("-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3 "
                          "-c tcp_user_timeout=5000")


def is_url(where: object) -> bool:
    """Whether `where` names a PostgreSQL database rather than a SQLite file."""
    return isinstance(where, str) and where.startswith(("postgresql://", "postgres://"))


def shown(url: str) -> str:
    """A URL (or libpq keyword string) fit for logs, errors and reprs: any password masked. The one redaction
    helper: every message that names a registry goes through it.

    >>> shown("postgresql://tether:secret@db:5432/tether")
    'postgresql://tether:***@db:5432/tether'
    >>> shown("postgresql://tether@db/tether?sslmode=require&password=secret")
    'postgresql://tether@db/tether?sslmode=require&password=***'
    >>> shown("host=db user=tether password='se cret' dbname=tether")
    'host=db user=tether password=*** dbname=tether'
    """
    text = re.sub(r"(://[^:/@?#]+):[^@/?#]*@", r"\1:***@", str(url))
    text = re.sub(r"([?&]password=)[^&#]*", r"\1***", text)
    return re.sub(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", text)


def has_password(url: str) -> bool:
    """Whether `url` carries a password (in its user part or a `password=` parameter): refused on command lines.

    >>> has_password("postgresql://tether@db/tether"), has_password("postgresql://tether:x@db/tether")
    (False, True)
    """
    return shown(url) != str(url)


def with_passfile(url: str, passfile: str | Path | None) -> str:
    """`url` with libpq's `passfile` parameter set to `passfile` (None: `url` as it is). RegistryError when `url`
    carries a password itself (it would end up in argv and logs) or `passfile` is not a readable file.

    >>> with_passfile("postgresql://tether:secret@db/tether", None)
    Traceback (most recent call last):
    ...
    bridge.registry.errors.RegistryError: the registry URL postgresql://tether:***@db/tether carries a password: \
put it in a libpq passfile (*:*:*:USER:PASSWORD, mode 0600) given by --registry-passfile or $PGPASSFILE
    """
    if has_password(url):
        raise RegistryError(f"the registry URL {shown(url)} carries a password: put it in a libpq passfile "
                            "(*:*:*:USER:PASSWORD, mode 0600) given by --registry-passfile or $PGPASSFILE")
    if passfile is None:
        return url
    path = Path(passfile)
    if not path.is_file():
        raise RegistryError(f"registry passfile {str(path)!r} is not a file")
    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k != "passfile"]
    query.append(("passfile", str(path.resolve())))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


class Backend(Protocol):
    """The registry's storage role. `Error`: the driver's base exception (a failed constraint, a full disk)."""

    dialect: str            # "sqlite" or "postgresql": which DDL a migration runs
    where: str              # the file or the URL (password masked), for messages
    Error: type[Exception]

    def execute(self, sql: str, args: tuple = ()): ...          # a cursor: fetchone(), fetchall()
    def begin(self) -> None: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def read(self) -> contextlib.AbstractContextManager[None]: ...
    def data_version(self) -> int: ...                          # changes when any connection committed
    def close(self) -> None: ...


def open_backend(where: Path | str) -> Backend:
    return PostgresBackend(str(where)) if is_url(where) else SqliteBackend(Path(where))


class SqliteBackend:
    """One SQLite file in WAL mode, synchronous=FULL; BEGIN IMMEDIATE makes writers (processes too) take turns."""

    dialect = "sqlite"
    Error = sqlite3.Error

    def __init__(self, path: Path):
        self.where = str(path)
        try:
            self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
        except sqlite3.Error as exc:
            raise RegistryError(f"cannot open the registry {self.where!r}: {exc}") from exc
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error:
            self._db.close()
            raise

    def execute(self, sql: str, args: tuple = ()):
        return self._db.execute(sql, args)

    def begin(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        self._db.execute("COMMIT")

    def rollback(self) -> None:
        if self._db.in_transaction:  # SQLite may have rolled back already (e.g. on a full disk)
            self._db.execute("ROLLBACK")

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        yield  # one connection, writers serialised: as the registry always read

    def data_version(self) -> int:
        return self._db.execute("PRAGMA data_version").fetchone()[0]

    def check(self) -> None:
        found = self._db.execute("PRAGMA quick_check").fetchone()[0]
        if found != "ok":
            raise RegistryError(f"the registry {self.where!r} is damaged: {found}")

    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    def set_schema_version(self, version: int) -> None:
        self._db.execute(f"PRAGMA user_version = {int(version)}")

    def may_change_schema(self) -> bool:
        return True  # whoever may write the file may change it

    def close(self) -> None:
        self._db.close()

    def __getattr__(self, name: str):
        """The rest of sqlite3.Connection (e.g. set_trace_callback), for tools and tests that look inside."""
        return getattr(self.__dict__["_db"], name)


def connect(url: str, *, autocommit: bool = True, application_name: str = "tether"):
    """A psycopg 3 connection to the registry's PostgreSQL database (keepalives on, 2 s connect timeout):
    for modules that keep their own tables there (session ownership, replica verification) and for the
    registry's listener and leader lock. RegistryUnavailable when it cannot be reached.

        with connect(registry.where_url) as conn:
            conn.execute("SELECT epoch FROM registry_epoch").fetchone()
    """
    import psycopg

    try:
        return psycopg.connect(url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S, keepalives=1,
                               keepalives_idle=5, keepalives_interval=2, keepalives_count=3, tcp_user_timeout=5000,
                               application_name=application_name, options=SERVER_SIDE_KEEPALIVES)
    except psycopg.Error as exc:
        raise RegistryUnavailable(f"registry unreachable: {shown(url)}: {_first_line(exc)}") from exc


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class PostgresBackend:
    """One psycopg connection (autocommit outside explicit transactions), reopened on the next call after it
    broke: every call while the server is unreachable raises RegistryUnavailable ("registry unreachable: ...").
    Writers take turns through a transaction-scoped advisory lock; reads that belong together run in one
    REPEATABLE READ snapshot (`read()`)."""

    dialect = "postgresql"

    def __init__(self, url: str):
        import psycopg

        self.url, self.where = url, shown(url)
        self.Error = psycopg.Error
        self._psycopg = psycopg
        self._conn = None
        self._reading = False
        self._connection()

    def _connection(self):
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.url)
        return self._conn

    def _lost(self, exc: Exception) -> RegistryUnavailable:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        return RegistryUnavailable(f"registry unreachable: {self.where}: {_first_line(exc)}")

    def execute(self, sql: str, args: tuple = ()):
        """Run one statement. Outside a transaction, a connection found broken (the server restarted since the
        last call) is reopened and the statement tried once more; inside one, the transaction is lost."""
        for attempt in (0, 1):
            conn = self._connection()
            idle = conn.info.transaction_status == self._psycopg.pq.TransactionStatus.IDLE
            try:
                return conn.execute(sql.replace("?", "%s"), args, prepare=False)
            except (self._psycopg.OperationalError, self._psycopg.InterfaceError) as exc:
                if not (conn.closed or conn.broken):
                    raise
                lost = self._lost(exc)
                if attempt or not idle:
                    raise lost from exc

    def begin(self) -> None:
        self.execute("BEGIN")
        self.execute("SELECT pg_advisory_xact_lock(?)", (WRITE_LOCK_KEY,))

    def commit(self) -> None:
        self.execute("COMMIT")

    def rollback(self) -> None:
        conn = self._conn
        if conn is None or conn.closed:
            return
        try:
            conn.execute("ROLLBACK")
        except self._psycopg.Error as exc:
            self._lost(exc)

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        conn = self._connection()
        idle = self._psycopg.pq.TransactionStatus.IDLE
        if self._reading or conn.info.transaction_status != idle:
            yield  # inside a write (or an outer read): already one snapshot
            return
        self.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        self._reading = True
        try:
            yield
        finally:
            self._reading = False
            self.rollback()

    def data_version(self) -> int:
        row = self.execute("SELECT epoch FROM registry_epoch WHERE id = 1").fetchone()
        return -1 if row is None else row[0]

    def check(self) -> None:
        pass  # PostgreSQL checks its own pages

    def notify(self, epoch: int) -> None:
        self.execute("SELECT pg_notify(?, ?)", (NOTIFY_CHANNEL, str(epoch)))

    def schema_version(self) -> int:
        """The last migration applied (0: none). Reads only: a role that may not create tables can ask."""
        if self.execute("SELECT to_regclass('schema_version')").fetchone()[0] is None:
            return 0
        row = self.execute("SELECT max(version) FROM schema_version").fetchone()
        return row[0] or 0

    def set_schema_version(self, version: int) -> None:
        import time

        self.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL, applied_ns BIGINT NOT NULL)")
        self.execute("INSERT INTO schema_version VALUES (?, ?)", (int(version), time.time_ns()))

    def role(self) -> str:
        """The database role this connection logged in as."""
        return self.execute("SELECT current_user").fetchone()[0]

    def may_change_schema(self) -> bool:
        """Whether this role may create tables (the admin); a gateway's least-privilege role may not."""
        return bool(self.execute("SELECT has_schema_privilege(current_user, 'public', 'CREATE')").fetchone()[0])

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
