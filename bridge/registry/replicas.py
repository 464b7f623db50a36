"""Per-replica verification of policy versions, in the registry's store: which Triton replica was checked to
serve which version (READY, and the probe batch reproduced within the gate's tolerance), when, and the verdict.

    rows = ReplicaVerifications.beside(registry)            # the registry's SQLite file, or its PostgreSQL URL
    rows.record("hopper", 4, "10.0.0.7:8001", "ok")           # verified_at = now (unix ns)
    rows.record("hopper", 4, "10.0.0.8:8001", "failed: output 'action' differs by 0.3")
    rows.record("hopper", 4, "10.0.0.8:8001", "lost: UNAVAILABLE")   # the replica went away: verify again
    rows.rows("hopper", 4)                                    # oldest first: Verification(policy, version, ...)
    rows.latest("hopper", 4)                                  # {replica: its newest Verification}

A replica may serve a version's batches only while its newest row for that version says "ok". The table is
append-only (the history is the audit), one row per check:

    replica_verifications(id, policy, version, replica, verified_at, result)     verified_at: unix ns

It is one of the registry's migrations (6); a SQLite file made by older code gets it here at open (CREATE TABLE IF
NOT EXISTS). On PostgreSQL the connection is the registry's (bridge.registry.backends: keepalives, timeouts, a
broken connection reopened at the next call), so verification works again once a restarted server is back;
while it is unreachable a call raises RegistryUnavailable. Thread-safe; call from a thread (`asyncio.to_thread`)
in async code.

    >>> v = ReplicaVerifications(":memory:")
    >>> v.record("hopper", 1, "127.0.0.1:8001", "ok").result
    'ok'
    >>> v.record("hopper", 1, "", "ok")
    Traceback (most recent call last):
    ...
    ValueError: replica '' must be a HOST:PORT address
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bridge.registry.backends import is_url, open_backend, shown
from bridge.registry.errors import RegistryError
from bridge.registry.migrations import MIGRATIONS

MAX_RESULT = 1000
_MIGRATION = 6  # the one that makes replica_verifications


@dataclass(frozen=True)
class Verification:
    policy: str
    version: int
    replica: str
    verified_at: int   # unix ns
    result: str        # "ok", or "failed: <why>" / "lost: <why>"

    @property
    def ok(self) -> bool:
        return self.result == "ok"


class ReplicaVerifications:
    """The replica_verifications table (see the module docstring). `target`: a SQLite path (":memory:" for
    none) or a postgresql:// URL (its password, if any, from a passfile: bridge.registry.backends)."""

    def __init__(self, target: str | Path):
        self._lock = threading.Lock()
        self._db = open_backend(target if is_url(target) else Path(target))
        try:
            if self._db.dialect == "sqlite":
                migration = next(m for m in MIGRATIONS if m.number == _MIGRATION)
                for statement in migration.sql("sqlite"):
                    if "replica_verifications" in statement:
                        self._db.execute(statement)
            elif self._db.execute("SELECT to_regclass('replica_verifications')").fetchone()[0] is None:
                raise RegistryError(f"the registry {shown(str(target))} has no replica_verifications table: "
                                    "open it once as its admin (Registry(url) migrates it)")
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def beside(cls, registry) -> ReplicaVerifications:
        """The table in the same store as `registry`: its SQLite file, or its PostgreSQL URL (`registry.path`)."""
        where = getattr(registry, "path", ":memory:")
        return cls(where if isinstance(where, str) else str(where))

    def record(self, policy: str, version: int, replica: str, result: str, *,
               at_ns: int | None = None) -> Verification:
        if not isinstance(policy, str) or not policy:
            raise ValueError(f"policy {policy!r} must be a non-empty name")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"version {version!r} must be an integer >= 1")
        if not isinstance(replica, str) or ":" not in replica:
            raise ValueError(f"replica {replica!r} must be a HOST:PORT address")
        if not isinstance(result, str) or not result:
            raise ValueError(f"result {result!r} must be 'ok' or a reason")
        row = Verification(policy, version, replica, time.time_ns() if at_ns is None else at_ns, result[:MAX_RESULT])
        with self._lock:
            self._db.execute("INSERT INTO replica_verifications (policy, version, replica, verified_at, result) "
                             "VALUES (?, ?, ?, ?, ?)", (row.policy, row.version, row.replica, row.verified_at,
                                                        row.result))
        return row

    def rows(self, policy: str | None = None, version: int | None = None) -> list[Verification]:
        """Every row (of `policy`, of `version`), oldest first."""
        where, args = [], []
        if policy is not None:
            where.append("policy = ?")
            args.append(policy)
        if version is not None:
            where.append("version = ?")
            args.append(version)
        sql = "SELECT policy, version, replica, verified_at, result FROM replica_verifications"
        sql += (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        with self._lock:
            return [Verification(*row) for row in self._db.execute(sql, tuple(args)).fetchall()]

    def latest(self, policy: str, version: int) -> dict[str, Verification]:
        """Per replica, its newest row for `policy` `version`."""
        return {row.replica: row for row in self.rows(policy, version)}

    def close(self) -> None:
        with self._lock:
            self._db.close()
