"""The replica_verifications table (bridge.registry.replicas) in both of the registry's stores: beside a SQLite
registry file, and in PostgreSQL (a server started here), where two gateways' rows land in one table."""

from __future__ import annotations

import pytest

from bridge.registry import Registry
from bridge.registry.replicas import ReplicaVerifications
from tether.cluster.postgres import PostgresServer, postgres_bin_dir


def exercise(a: ReplicaVerifications, b: ReplicaVerifications) -> None:
    """`a` and `b`: two connections to one table (two gateways)."""
    a.record("hopper", 2, "10.0.0.7:8001", "ok", at_ns=10)
    b.record("hopper", 2, "10.0.0.8:8001", "ok", at_ns=11)
    a.record("hopper", 2, "10.0.0.8:8001", "lost: UNAVAILABLE", at_ns=12)
    a.record("hopper", 3, "10.0.0.7:8001", "failed: output 'action' differs by 0.3", at_ns=13)
    rows = b.rows("hopper", 2)
    assert [(r.replica, r.verified_at, r.ok) for r in rows] == [
        ("10.0.0.7:8001", 10, True), ("10.0.0.8:8001", 11, True), ("10.0.0.8:8001", 12, False)]
    latest = b.latest("hopper", 2)
    assert latest["10.0.0.7:8001"].ok and latest["10.0.0.8:8001"].result.startswith("lost")
    assert [r.version for r in a.rows("hopper")] == [2, 2, 2, 3] and a.rows("other") == []
    with pytest.raises(ValueError, match="version 0 must be an integer >= 1"):
        a.record("hopper", 0, "10.0.0.7:8001", "ok")


def test_beside_a_sqlite_registry(tmp_path):
    with Registry(tmp_path / "registry.sqlite") as registry:
        a, b = ReplicaVerifications.beside(registry), ReplicaVerifications.beside(registry)
        try:
            exercise(a, b)
        finally:
            a.close()
            b.close()
        assert registry.versions("hopper") == []   # the registry's own tables are untouched


@pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL's initdb is not installed "
                    "(/usr/lib/postgresql/*/bin/initdb; Debian package postgresql)")
def test_in_postgresql(tmp_path):
    with PostgresServer(tmp_path / "pg") as pg, Registry(pg.url) as registry:
        a, b = ReplicaVerifications.beside(registry), ReplicaVerifications(pg.url)
        try:
            exercise(a, b)
        finally:
            a.close()
            b.close()
