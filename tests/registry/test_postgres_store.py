"""The registry on PostgreSQL keeps the SQLite store's rules: the same tests (imported from test_store and
test_estops, run here against a real PostgreSQL server), plus what only a shared database has to show: the slots
enforced by the database itself, versioned migrations, the epoch bumped and NOTIFYed in every change's transaction,
writers from several registries taking turns, and a server that goes away (RegistryUnavailable, then caught up)."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from bridge.registry import Registry, RegistryError, RegistryUnavailable, State
from bridge.registry.backends import NOTIFY_CHANNEL, connect
from bridge.registry.migrations import latest
from tests.registry.helpers import POLICY, add, reach, serving
from tests.registry.test_estops import (  # noqa: F401  (run here against PostgreSQL)
    test_an_estop_and_its_release_survive_reopening_with_their_audit_events,
    test_bad_reasons_names_and_targets_are_refused_before_anything_changes,
)
from tests.registry.test_store import (  # noqa: F401  (run here against PostgreSQL)
    test_add_as_live_replaces_the_live_version,
    test_add_validates_and_registers,
    test_canary_settings,
    test_every_illegal_move_is_refused_and_changes_nothing,
    test_every_legal_move,
    test_gate_results_are_appended_with_an_audit_event,
    test_pins,
    test_promotions_replace_the_slot_holder_and_rollback_restores_previous_live,
    test_reads_and_events_paging,
    test_threads_share_one_registry,
)
from tether.cluster.postgres import PostgresServer, postgres_bin_dir

pytestmark = pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL's initdb is not installed "
                                "(/usr/lib/postgresql/*/bin/initdb; Debian package postgresql)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with PostgresServer(tmp_path_factory.mktemp("postgres")) as pg:
        yield pg


@pytest.fixture
def url(server: PostgresServer) -> str:
    """An empty database for each test: the schema dropped, so the registry migrates it again."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    return server.url


@pytest.fixture
def registry(url: str):
    with Registry(url) as registry:
        yield serving(registry)


@pytest.fixture
def path(url: str) -> str:  # test_estops' registries reopen "the file": here, the database
    return url


def test_the_slots_are_enforced_by_the_database(registry: Registry):
    reach(registry, State.CANARY)
    for state in ("live", "canary"):
        with pytest.raises(psycopg.errors.UniqueViolation, match=f"one_{state}"):
            with connect(registry.path) as conn:
                conn.execute("UPDATE versions SET state = %s WHERE policy = %s AND version IN (1, 2)",
                             (state, POLICY))
    with pytest.raises(psycopg.errors.UniqueViolation, match="one_standing_estop"):
        registry.estop("all", who="operator:ada", why="")
        with connect(registry.path) as conn:
            conn.execute("INSERT INTO estops (id, target, who, why, t_ns) VALUES ('x', 'all', 'w', '', 1)")


def test_migrations_are_versioned_and_a_newer_database_is_refused(url: str):
    with Registry(url):
        pass
    with Registry(url):  # a second open applies nothing
        pass
    with connect(url) as conn:
        assert [r[0] for r in conn.execute("SELECT version FROM schema_version").fetchall()] == [latest()]
        conn.execute("INSERT INTO schema_version VALUES (99, 0)")
    with pytest.raises(RegistryError, match=rf"schema 99, newer than this code's {latest()}"):
        Registry(url)


def test_every_change_bumps_the_epoch_and_notifies_it(registry: Registry):
    with connect(registry.path) as listener:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        before = registry.epoch()
        reach(registry, State.LIVE)  # add, gated, live: three changes
        registry.estop("all", who="operator:ada", why="drill")
        seen = [int(n.payload) for n in listener.notifies(timeout=5, stop_after=4)]
    assert seen == [before + 1, before + 2, before + 3, before + 4] and registry.epoch() == before + 4
    with pytest.raises(RegistryError):  # a refused change bumps nothing
        registry.move(POLICY, 2, State.CANARY, who="operator:bob", why="not allowed from live")
    assert registry.epoch() == before + 4
    epoch, rollouts = registry.snapshot()
    assert epoch == before + 4 and rollouts[POLICY].live == 2


def test_two_registries_racing_promotes_leave_one_live_version(url: str):
    """Two gateways' registries promote different versions at once: writers take turns, every move is one
    transaction, and the database never holds two live versions."""
    with Registry(url) as a, Registry(url) as b:
        serving(a)
        for version in range(2, 22):
            add(a, version)
            a.move(POLICY, version, State.GATED, who="gate", why="passed")
        errors: list[Exception] = []

        def promote(registry: Registry, versions: range) -> None:
            for version in versions:
                try:
                    registry.move(POLICY, version, State.LIVE, who="operator", why="race")
                except Exception as exc:  # noqa: BLE001 (collected: the test fails on any)
                    errors.append(exc)

        threads = [threading.Thread(target=promote, args=(a, range(2, 22, 2))),
                   threading.Thread(target=promote, args=(b, range(3, 22, 2)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        live = [r.version for r in a.versions(POLICY) if r.state is State.LIVE]
        assert len(live) == 1 and a.rollout(POLICY).live == b.rollout(POLICY).live == live[0]
        entered = [e.version for e in a.events(POLICY, limit=10_000) if e.to_state == "live" and e.kind == "state"]
        assert entered[-1] == live[0] and sorted(entered[1:]) == list(range(2, 22))


def test_an_unreachable_server_refuses_changes_and_the_registry_catches_up(tmp_path_factory):
    with PostgresServer(tmp_path_factory.mktemp("restarted")) as pg, Registry(pg.url) as registry:
        serving(registry)
        reach(registry, State.GATED)
        pg.stop()
        for call in (lambda: registry.move(POLICY, 2, State.LIVE, who="operator", why="down"),
                     lambda: registry.rollout(POLICY), lambda: registry.estop("all", who="operator", why="down")):
            with pytest.raises(RegistryUnavailable, match="registry unreachable: postgresql://tether@127.0.0.1"):
                call()
        pg.start()
        assert registry.move(POLICY, 2, State.LIVE, who="operator", why="back").state is State.LIVE
        pg.restart()  # connections dropped while idle: the next call reconnects by itself
        assert registry.rollout(POLICY).live == 2


def test_a_directory_path_is_not_taken_for_a_url(tmp_path_factory):
    """A SQLite path that merely contains "postgresql" stays a file."""
    folder = Path(tmp_path_factory.mktemp("postgresql"))
    with Registry(folder / "registry.sqlite") as registry:
        assert not registry.shared and isinstance(registry.path, Path)
