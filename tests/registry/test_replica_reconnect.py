"""Replica verification (bridge.registry.replicas) on the registry's connection policy (bridge.registry.backends):
after PostgreSQL restarts, or crashes and comes back, the same object records and reads again, in the same process;
while the server is down a call fails at once with RegistryUnavailable, naming the registry without a password."""

from __future__ import annotations

import time

import pytest

from bridge.registry import Registry, RegistryUnavailable
from bridge.registry.replicas import ReplicaVerifications
from tether.cluster.postgres import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL's initdb is not installed "
                                "(/usr/lib/postgresql/*/bin/initdb; Debian package postgresql)")


def test_replica_verification_works_again_after_a_postgres_restart_without_restarting_the_process(tmp_path):
    with PostgresServer(tmp_path / "pg") as pg, Registry(pg.url) as registry:
        rows = ReplicaVerifications.beside(registry)
        try:
            rows.record("hopper", 1, "10.0.0.7:8001", "ok", at_ns=1)
            dsn = rows._db._conn.info.dsn  # the one policy: backends.connect's keepalives and timeouts
            assert "keepalives=1" in dsn and "tcp_user_timeout=5000" in dsn and "connect_timeout=2" in dsn
            pg.restart()
            rows.record("hopper", 1, "10.0.0.8:8001", "ok", at_ns=2)   # the first call after: reconnected
            pg.kill()                                                    # a crash: nothing listens
            started = time.monotonic()
            with pytest.raises(RegistryUnavailable, match=rf"registry unreachable: postgresql://tether@127\.0\.0\.1:"
                               rf"{pg.port}/tether"):
                rows.record("hopper", 1, "10.0.0.9:8001", "ok", at_ns=3)
            assert time.monotonic() - started < 5.0   # refused, not hung (the connect timeout is 2 s)
            pg.start()
            rows.record("hopper", 1, "10.0.0.9:8001", "ok", at_ns=4)
            assert [(r.replica, r.verified_at) for r in rows.rows("hopper", 1)] == [
                ("10.0.0.7:8001", 1), ("10.0.0.8:8001", 2), ("10.0.0.9:8001", 4)]
        finally:
            rows.close()
