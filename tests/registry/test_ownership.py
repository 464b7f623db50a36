"""Session ownership (bridge.registry.ownership) in SQLite and PostgreSQL: every claim bumps the epoch in one
transaction, racing claims from several threads get distinct epochs, `stale` answers for a whole group in one
query, and a store that is down says so (OwnershipUnavailable) and works again once it is back."""

from __future__ import annotations

import threading

import pytest

from bridge.registry.ownership import MemoryOwnership, OwnershipUnavailable, open_ownership
from tether.cluster.postgres import PostgresServer, postgres_bin_dir


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def target(request, tmp_path):
    if request.param == "memory":
        yield None
    elif request.param == "sqlite":
        yield tmp_path / "registry.sqlite"
    else:
        if postgres_bin_dir() is None:
            pytest.skip("PostgreSQL binaries (initdb, postgres) not found")
        with PostgresServer(tmp_path / "pg") as pg:
            yield pg.url


def test_claims_bump_the_epoch_and_stale_names_the_old_ones(target):
    owners = open_ownership(target)
    try:
        a = owners.claim("robot-1", owner="gw-a")
        b = owners.claim("robot-1", owner="gw-b")
        again = owners.claim("robot-1", owner="gw-b")
        assert (a.epoch, a.previous, a.continues()) == (1, None, False)
        assert (b.epoch, b.previous, b.continues()) == (2, ("gw-a", 1), False)
        assert (again.epoch, again.continues()) == (3, True)
        assert owners.claim("robot-2", owner="gw-a").epoch == 1
        assert owners.stale({("robot-1", 1), ("robot-1", 3), ("robot-2", 1), ("robot-9", 1)}) == {
            ("robot-1", 1), ("robot-9", 1)}
        assert owners.current("robot-1") == ("gw-b", 3) and owners.current("nobody") is None
        with pytest.raises(ValueError, match="owner: expected a non-empty string"):
            owners.claim("robot-1", owner="")
    finally:
        owners.close()


def test_racing_claims_get_distinct_epochs(target):
    stores = [open_ownership(target) for _ in range(4)] if target is not None else [MemoryOwnership()] * 4
    epochs: list[int] = []
    lock = threading.Lock()

    def claim(store, name):
        for _ in range(10):
            e = store.claim("contested", owner=name).epoch
            with lock:
                epochs.append(e)

    threads = [threading.Thread(target=claim, args=(s, f"gw-{i}")) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(epochs) == list(range(1, 41))
    for s in {id(s): s for s in stores}.values():
        s.close()


def test_postgres_down_then_back(tmp_path):
    if postgres_bin_dir() is None:
        pytest.skip("PostgreSQL binaries (initdb, postgres) not found")
    with PostgresServer(tmp_path / "pg") as pg:
        owners = open_ownership(pg.url)
        owners.claim("s", owner="gw-a")
        pg.kill()
        with pytest.raises(OwnershipUnavailable, match="ownership store 127.0.0.1"):
            owners.stale({("s", 1)})
        with pytest.raises(OwnershipUnavailable):
            owners.claim("s", owner="gw-b")
        pg.start()
        assert owners.stale({("s", 1)}) == set()
        assert owners.claim("s", owner="gw-b").epoch == 2
        owners.close()
