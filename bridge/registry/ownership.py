"""Which gateway owns a session id, under which identity, with an epoch that fences the ones it moved away from.

    owners = open_ownership("runs/models/.tether/registry.sqlite")   # or "postgresql://tether@127.0.0.1:5432/tether"
    claim = owners.claim("robot-1", owner="gw-a", identity="robot:arm_1")   # on Hello: epoch 1, previous None
    claim = owners.claim("robot-1", owner="gw-b", identity="robot:arm_1")   # moved: epoch 2, previous ("gw-a", 1)
    owners.claim("robot-1", owner="gw-b", identity="robot:arm_2")           # OwnershipRefused: nothing changed
    owners.stale({("robot-1", 1), ("robot-1", 2)})   # {("robot-1", 1)}: gw-a's epoch is not current any more
    owners.current("robot-1")                        # ("gw-b", 2)

The table (`session_owners`, made by the registry's migrations: bridge.registry.migrations) lives in the registry's
own store: the same SQLite file (its own connection, WAL, synchronous=FULL, an IMMEDIATE transaction per claim) or
the same PostgreSQL database (one transaction: `INSERT ... ON CONFLICT DO UPDATE SET epoch = epoch + 1 ... WHERE
<the identity matches> RETURNING`). Every claim bumps the epoch, so two gateways can never hold the same (session,
epoch). A gateway stamps every transition it logs with its claim's epoch (`Transition.owner_epoch`) and, before its
log acknowledges a group commit, asks `stale` once for the (session, epoch) pairs in it: a pair whose epoch is no
longer current is not acknowledged and its session is fenced (bridge.gateway.server). Epochs only grow, so a pair
confirmed current at the check was current at every earlier instant of that epoch: the check also covers what the
group wrote before it.

Identity: the first authenticated claim binds the id to its identity ("robot:arm_1", what the gateway's
`Authorizer.require` proved); from then on a claim by any other identity, or by none (a gateway with open access), is
refused with `OwnershipRefused` (PERMISSION_DENIED) in the same statement that would have bumped the epoch: the
epoch, the owner and the identity stay as they were, so the session that holds the id is not fenced. A claim with
no identity (open access, nothing configured) on an id no identity holds works as it always did.

`MemoryOwnership` is the same for one process (an in-memory registry: one gateway, nothing shared).
A store that cannot be reached raises `OwnershipUnavailable` (the gateway then refuses the Hello with
UNAVAILABLE, or holds back acknowledgements: nothing is acknowledged that ownership has not confirmed). PostgreSQL
connections come from `bridge.registry.backends.connect` (its keepalives, connect timeout and the reconnect on the
next call after one broke), with lock, statement and idle-in-transaction timeouts; a call that finds the previous one
still waiting on the database after `BUSY_S` is refused at once (OwnershipUnavailable) instead of queueing behind it.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from bridge.common.errors import PermissionDenied

__all__ = ["Claim", "MemoryOwnership", "Ownership", "OwnershipRefused", "OwnershipUnavailable", "PostgresOwnership",
           "SqliteOwnership", "open_ownership"]

MAX_ID_CHARS = 256
BUSY_S = 2.0  # a call waits this long for the one before it (the database not answering), then is refused
# per connection (PostgreSQL): a claim waiting on another's row lock, any statement, and a transaction left open by
# a client that went away (its row lock with it) give up after these
SESSION_TIMEOUTS = ("SET lock_timeout = '2s'", "SET statement_timeout = '5s'",
                    "SET idle_in_transaction_session_timeout = '10s'")


class OwnershipUnavailable(RuntimeError):
    """The ownership store could not be reached or written (the message says which store and why)."""


class OwnershipRefused(PermissionDenied):
    """A claim on a session id bound to another identity (PERMISSION_DENIED): refused before anything changed."""


@dataclass(frozen=True)
class Claim:
    """A gateway's claim on a session id: `epoch` (1, 2, ...), who held it before (None for a new id) and the
    identity the id is bound to ("" when none: open access)."""

    session: str
    owner: str
    epoch: int
    previous: tuple[str, int] | None = None
    identity: str = ""

    def continues(self) -> bool:
        """Whether the previous epoch was this same owner's (its own log then knows the session's steps)."""
        return self.previous is not None and self.previous == (self.owner, self.epoch - 1)


class Ownership(Protocol):
    """What a gateway needs from the ownership store."""

    def claim(self, session: str, *, owner: str, identity: str | None = None) -> Claim: ...

    def stale(self, pairs: Collection[tuple[str, int]]) -> set[tuple[str, int]]: ...

    def current(self, session: str) -> tuple[str, int] | None: ...

    def close(self) -> None: ...


def _check(session: object, owner: object, identity: object = None) -> None:
    for what, value in (("session", session), ("owner", owner)):
        if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
            raise ValueError(f"{what}: expected a non-empty string of at most {MAX_ID_CHARS} characters, "
                             f"got {value!r:.80}")
    if identity is not None and (not isinstance(identity, str) or not identity or len(identity) > MAX_ID_CHARS):
        raise ValueError(f"identity: expected None or a non-empty string of at most {MAX_ID_CHARS} characters, "
                         f"got {identity!r:.80}")


def refusal(session: str, bound: str, identity: str | None) -> str | None:
    """Why a claim by `identity` (None: open access) on an id bound to `bound` ("" = none) is refused, or None.
    The message names the session and the claimant, not the identity holding it.

    >>> refusal("arm-a", "", None), refusal("arm-a", "", "robot:b"), refusal("arm-a", "robot:a", "robot:a")
    (None, None, None)
    >>> refusal("arm-a", "robot:a", "robot:b")
    "session 'arm-a' belongs to another identity: robot:b may not claim it (PERMISSION_DENIED before any epoch moved)"
    """
    if not bound or identity == bound:
        return None
    claimant = identity if identity is not None else "a caller without credentials (open access)"
    return f"session {session!r} belongs to another identity: {claimant} may not claim it " \
           "(PERMISSION_DENIED before any epoch moved)"


class MemoryOwnership:
    """Ownership within one process (no shared store)."""

    def __init__(self):
        self._owners: dict[str, tuple[str, int]] = {}
        self._identities: dict[str, str] = {}
        self._lock = threading.Lock()

    def claim(self, session: str, *, owner: str, identity: str | None = None) -> Claim:
        _check(session, owner, identity)
        with self._lock:
            bound = self._identities.get(session, "")
            if (why := refusal(session, bound, identity)) is not None:
                raise OwnershipRefused(why)
            previous = self._owners.get(session)
            epoch = (previous[1] if previous else 0) + 1
            self._owners[session] = (owner, epoch)
            self._identities[session] = bound or identity or ""
        return Claim(session, owner, epoch, previous, self._identities[session])

    def stale(self, pairs: Collection[tuple[str, int]]) -> set[tuple[str, int]]:
        with self._lock:
            return {(s, e) for s, e in pairs if self._owners.get(s, ("", 0))[1] != e}

    def current(self, session: str) -> tuple[str, int] | None:
        return self._owners.get(session)

    def close(self) -> None:
        pass


class _SqlOwnership:
    """The SQL both stores share; `_run(fn)` runs fn(cursor) in one transaction (subclasses)."""

    _P = "?"  # the driver's parameter marker
    _FOR_UPDATE = ""  # the dialect's row lock for the claim's read (SQLite's IMMEDIATE transaction locks the file)

    def __init__(self, where: str):
        self.where = where
        self._lock = threading.Lock()  # one connection: the event loop claims, the log's writer thread checks

    @contextlib.contextmanager
    def _locked(self, what: str) -> Iterator[None]:
        """The connection's lock, or OwnershipUnavailable when the call before has waited over BUSY_S."""
        if not self._lock.acquire(timeout=BUSY_S):
            raise OwnershipUnavailable(f"ownership store {self.where}: {what}: busy: the call before this one has "
                                       f"had no answer from the database for over {BUSY_S:g} s")
        try:
            yield
        finally:
            self._lock.release()

    def claim(self, session: str, *, owner: str, identity: str | None = None) -> Claim:
        """Bump the epoch of `session` for `owner`; OwnershipRefused (nothing changed) when the id is bound to
        another identity (see the module docstring)."""
        _check(session, owner, identity)
        p = self._P

        def run(cur) -> Claim:
            cur.execute(f"SELECT owner, epoch, identity FROM session_owners WHERE session = {p}{self._FOR_UPDATE}",
                        (session,))
            row = cur.fetchone()
            if row is not None and (why := refusal(session, row[2], identity)) is not None:
                raise OwnershipRefused(why)
            # the WHERE repeats the check in the statement that bumps: a row another claim inserted meanwhile
            cur.execute(f"INSERT INTO session_owners (session, owner, epoch, claimed_ns, identity) "
                        f"VALUES ({p}, {p}, 1, {p}, {p}) ON CONFLICT (session) DO UPDATE SET owner = excluded.owner, "
                        f"epoch = session_owners.epoch + 1, claimed_ns = excluded.claimed_ns, identity = CASE WHEN "
                        f"session_owners.identity = '' THEN excluded.identity ELSE session_owners.identity END "
                        f"WHERE session_owners.identity = '' OR session_owners.identity = excluded.identity "
                        f"RETURNING epoch, identity", (session, owner, time.time_ns(), identity or ""))
            got = cur.fetchone()
            if got is None:
                raise OwnershipRefused(refusal(session, "?", identity))
            return Claim(session, owner, int(got[0]), (row[0], int(row[1])) if row else None, got[1])

        return self._run(run, f"claiming session {session!r} for {owner!r}")

    def stale(self, pairs: Collection[tuple[str, int]]) -> set[tuple[str, int]]:
        """The pairs whose epoch is not the session's current one: one query for all of them."""
        if not pairs:
            return set()
        sessions = sorted({s for s, _ in pairs})
        marks = ", ".join([self._P] * len(sessions))

        def run(cur) -> dict[str, int]:
            cur.execute(f"SELECT session, epoch FROM session_owners WHERE session IN ({marks})", sessions)
            return {s: int(e) for s, e in cur.fetchall()}

        current = self._run(run, f"checking {len(sessions)} sessions' ownership", write=False)
        return {(s, e) for s, e in pairs if current.get(s) != e}

    def current(self, session: str) -> tuple[str, int] | None:
        def run(cur):
            cur.execute(f"SELECT owner, epoch FROM session_owners WHERE session = {self._P}", (session,))
            return cur.fetchone()

        row = self._run(run, f"reading session {session!r}'s owner", write=False)
        return (row[0], int(row[1])) if row else None


def _ensure_schema(target: str) -> None:
    """The registry's migrations (session_owners and its identity column among them) where `target` lacks them:
    a store opened before any registry (a new file, a new database). Nothing runs where the table is there."""
    from bridge.registry.backends import open_backend
    from bridge.registry.migrations import migrate

    backend = open_backend(target)
    try:
        backend.begin()
        try:
            migrate(backend)
        except BaseException:
            backend.rollback()
            raise
        backend.commit()
    finally:
        backend.close()


class SqliteOwnership(_SqlOwnership):
    """The table in a SQLite file (the registry's): other processes on this machine share it."""

    def __init__(self, path: str | Path):
        super().__init__(str(path))
        try:
            self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            try:
                self._db.execute("SELECT identity FROM session_owners LIMIT 0")
            except sqlite3.OperationalError:  # no table, or one older code made: the registry's migrations
                _ensure_schema(str(path))
        except Exception as exc:
            raise OwnershipUnavailable(f"ownership store {path}: {exc}") from exc

    def _run(self, fn, what: str, *, write: bool = True):
        with self._locked(what):
            cur = self._db.cursor()
            try:
                cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = fn(cur)
                except BaseException:
                    cur.execute("ROLLBACK")
                    raise
                cur.execute("COMMIT")
                return result
            except sqlite3.Error as exc:
                raise OwnershipUnavailable(f"ownership store {self.where}: {what}: {exc}") from exc
            finally:
                cur.close()

    def close(self) -> None:
        with self._lock:
            self._db.close()


class PostgresOwnership(_SqlOwnership):
    """The table in a PostgreSQL database (the registry's, `--registry postgresql://...`), on a connection from
    `backends.connect` (one policy: keepalives, connect timeout) with SESSION_TIMEOUTS; a broken connection is
    reopened on the next call."""

    _P = "%s"
    _FOR_UPDATE = " FOR UPDATE"

    def __init__(self, url: str):
        from bridge.registry.backends import shown

        super().__init__(shown(url).split("@")[-1])  # no credentials in messages
        self._url = url
        self._conn = None
        try:
            self._run(lambda cur: cur.execute("SELECT identity FROM session_owners LIMIT 0"), "reading session_owners",
                      write=False)
        except OwnershipUnavailable as exc:
            if "session_owners" not in str(exc) and "identity" not in str(exc):
                raise
            try:  # a database no registry migrated yet (or older code's table): the registry's migrations
                _ensure_schema(url)
            except Exception as schema_exc:
                raise OwnershipUnavailable(f"ownership store {self.where}: creating session_owners: "
                                           f"{schema_exc}") from schema_exc

    def _connection(self):
        from bridge.registry.backends import connect

        if self._conn is None or self._conn.closed or self._conn.broken:
            conn = connect(self._url, application_name=f"tether-ownership pid={os.getpid()}")
            try:
                for statement in SESSION_TIMEOUTS:
                    conn.execute(statement)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _run(self, fn, what: str, *, write: bool = True):
        import psycopg

        from bridge.registry.errors import RegistryUnavailable

        with self._locked(what):
            try:
                conn = self._connection()
                with conn.transaction(), conn.cursor() as cur:
                    return fn(cur)
            except (psycopg.Error, RegistryUnavailable) as exc:
                if self._conn is not None and (self._conn.broken or self._conn.closed):
                    self._conn = None
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise OwnershipUnavailable(f"ownership store {self.where}: {what}: {first}") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def open_ownership(target: str | Path | None) -> Ownership:
    """The store beside the registry: a `postgresql://` URL, a SQLite file path, or None / ":memory:"
    (in this process only)."""
    if target is None or str(target) == ":memory:":
        return MemoryOwnership()
    text = str(target)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresOwnership(text)
    return SqliteOwnership(text)
