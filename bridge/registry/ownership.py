"""Which gateway owns a session id, with an epoch that fences the ones it moved away from.

    owners = open_ownership("runs/models/.tether/registry.sqlite")   # or "postgresql://tether@127.0.0.1:5432/tether"
    claim = owners.claim("robot-1", owner="gw-a")    # on Hello: Claim(session, owner, epoch=1, previous=None)
    claim = owners.claim("robot-1", owner="gw-b")    # the client moved: epoch 2, previous=("gw-a", 1)
    owners.stale({("robot-1", 1), ("robot-1", 2)})   # {("robot-1", 1)}: gw-a's epoch is not current any more
    owners.current("robot-1")                        # ("gw-b", 2)

The table (`session_owners`) lives in the registry's own store: the same SQLite file (its own connection,
WAL, synchronous=FULL, an IMMEDIATE transaction per claim) or the same PostgreSQL database (one transaction:
`INSERT ... ON CONFLICT DO UPDATE SET epoch = epoch + 1 RETURNING`). Every claim bumps the epoch, so two
gateways can never hold the same (session, epoch). A gateway stamps every transition it logs with its
claim's epoch (`Transition.owner_epoch`) and, before its log acknowledges a group commit, asks `stale` once
for the (session, epoch) pairs in it: a pair whose epoch is no longer current is not acknowledged and its
session is fenced (bridge.gateway.server). Epochs only grow, so a pair confirmed current at the check was
current at every earlier instant of that epoch: the check also covers what the group wrote before it.

`MemoryOwnership` is the same for one process (an in-memory registry: one gateway, nothing shared).
A store that cannot be reached raises `OwnershipUnavailable` (the gateway then refuses the Hello with
UNAVAILABLE, or holds back acknowledgements: nothing is acknowledged that ownership has not confirmed).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

__all__ = ["Claim", "MemoryOwnership", "Ownership", "OwnershipUnavailable", "PostgresOwnership", "SqliteOwnership",
           "open_ownership"]

MAX_ID_CHARS = 256


class OwnershipUnavailable(RuntimeError):
    """The ownership store could not be reached or written (the message says which store and why)."""


@dataclass(frozen=True)
class Claim:
    """A gateway's claim on a session id: `epoch` (1, 2, ...) and who held it before (None for a new id)."""

    session: str
    owner: str
    epoch: int
    previous: tuple[str, int] | None = None

    def continues(self) -> bool:
        """Whether the previous epoch was this same owner's (its own log then knows the session's steps)."""
        return self.previous is not None and self.previous == (self.owner, self.epoch - 1)


class Ownership(Protocol):
    """What a gateway needs from the ownership store."""

    def claim(self, session: str, *, owner: str) -> Claim: ...

    def stale(self, pairs: Collection[tuple[str, int]]) -> set[tuple[str, int]]: ...

    def current(self, session: str) -> tuple[str, int] | None: ...

    def close(self) -> None: ...


def _check(session: object, owner: object) -> None:
    for what, value in (("session", session), ("owner", owner)):
        if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
            raise ValueError(f"{what}: expected a non-empty string of at most {MAX_ID_CHARS} characters, "
                             f"got {value!r:.80}")


class MemoryOwnership:
    """Ownership within one process (no shared store)."""

    def __init__(self):
        self._owners: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def claim(self, session: str, *, owner: str) -> Claim:
        _check(session, owner)
        with self._lock:
            previous = self._owners.get(session)
            epoch = (previous[1] if previous else 0) + 1
            self._owners[session] = (owner, epoch)
        return Claim(session, owner, epoch, previous)

    def stale(self, pairs: Collection[tuple[str, int]]) -> set[tuple[str, int]]:
        with self._lock:
            return {(s, e) for s, e in pairs if self._owners.get(s, ("", 0))[1] != e}

    def current(self, session: str) -> tuple[str, int] | None:
        return self._owners.get(session)

    def close(self) -> None:
        pass


class _SqlOwnership:
    """The SQL both stores share; `_run(fn)` runs fn(cursor) in one transaction (subclasses)."""

    _CREATE = ("CREATE TABLE IF NOT EXISTS session_owners (session TEXT PRIMARY KEY, owner TEXT NOT NULL, "
               "epoch BIGINT NOT NULL, claimed_ns BIGINT NOT NULL)")
    _P = "?"  # the driver's parameter marker
    _FOR_UPDATE = ""  # the dialect's row lock for the claim's read (SQLite's IMMEDIATE transaction locks the file)

    def __init__(self, where: str):
        self.where = where
        self._lock = threading.Lock()  # one connection: the event loop claims, the log's writer thread checks

    def claim(self, session: str, *, owner: str) -> Claim:
        _check(session, owner)
        p = self._P

        def run(cur) -> Claim:
            cur.execute(f"SELECT owner, epoch FROM session_owners WHERE session = {p}{self._FOR_UPDATE}", (session,))
            row = cur.fetchone()
            cur.execute(f"INSERT INTO session_owners (session, owner, epoch, claimed_ns) VALUES ({p}, {p}, 1, {p}) "
                        f"ON CONFLICT (session) DO UPDATE SET owner = excluded.owner, "
                        f"epoch = session_owners.epoch + 1, claimed_ns = excluded.claimed_ns RETURNING epoch",
                        (session, owner, time.time_ns()))
            epoch = int(cur.fetchone()[0])
            return Claim(session, owner, epoch, (row[0], int(row[1])) if row else None)

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


class SqliteOwnership(_SqlOwnership):
    """The table in a SQLite file (the registry's): other processes on this machine share it."""

    def __init__(self, path: str | Path):
        super().__init__(str(path))
        try:
            self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=10.0)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(self._CREATE)
        except sqlite3.Error as exc:
            raise OwnershipUnavailable(f"ownership store {path}: {exc}") from exc

    def _run(self, fn, what: str, *, write: bool = True):
        with self._lock:
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
    """The table in a PostgreSQL database (the registry's, `--registry postgresql://...`); reconnects when the
    connection broke."""

    _P = "%s"
    _FOR_UPDATE = " FOR UPDATE"

    def __init__(self, url: str, *, connect_timeout_s: float = 2.0):
        super().__init__(url.split("@")[-1])  # no credentials in messages
        self._url, self._timeout = url, connect_timeout_s
        self._conn = None
        self._run(lambda cur: cur.execute(self._CREATE), "creating session_owners")

    def _connection(self):
        import psycopg

        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(self._url, connect_timeout=max(1, int(self._timeout)))
        return self._conn

    def _run(self, fn, what: str, *, write: bool = True):
        import psycopg

        with self._lock:
            try:
                conn = self._connection()
                with conn.transaction(), conn.cursor() as cur:
                    return fn(cur)
            except psycopg.Error as exc:
                if self._conn is not None and self._conn.broken:
                    self._conn = None
                raise OwnershipUnavailable(f"ownership store {self.where}: {what}: {exc}") from exc

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
