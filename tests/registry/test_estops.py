"""Operator e-stops in the registry file: one transaction with their audit event, one standing per target, bounded
reasons refused before anything changes, ids unique across restarts and across a re-created file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bridge.registry import Registry, RegistryError, RegistryWriteFailed


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "registry.sqlite"


def snapshot(registry: Registry) -> tuple:
    rows = registry._db.execute("SELECT * FROM estops ORDER BY seq").fetchall()
    return rows, registry.events(limit=10_000)


def test_an_estop_and_its_release_survive_reopening_with_their_audit_events(path: Path):
    with Registry(path) as registry:
        record, changed = registry.estop("robot=arm_1", who="operator:ada", why="person in the cell")
        assert changed and record.standing and record.id.startswith("estop-1-")
    with Registry(path) as registry:  # a restarted gateway reads what stands
        assert [(r.id, r.target, r.who, r.why) for r in registry.standing_estops()] == [
            (record.id, "robot=arm_1", "operator:ada", "person in the cell")]
        assert not registry.released(record.id)
        released, changed = registry.release("robot=arm_1", who="operator:bob", why="cell clear")
        assert changed and released.id == record.id and not released.standing
    with Registry(path) as registry:
        assert registry.standing_estops() == [] and registry.released(record.id)
        again = registry.estop_record(record.id)
        assert (again.released_by, again.released_why) == ("operator:bob", "cell clear")
        events = [(e.kind, e.from_state, e.to_state, e.who, e.detail, e.figures) for e in registry.events()]
    assert events == [("estop", "", record.id, "operator:ada", "robot=arm_1", {"changed": 1.0}),
                      ("release", record.id, "", "operator:bob", "robot=arm_1", {"changed": 1.0})]


def test_one_standing_estop_per_target_enforced_by_the_schema(path: Path):
    with Registry(path) as registry:
        first, changed = registry.estop("all", who="operator:ada", why="drill")
        same, again = registry.estop("all", who="operator:bob", why="pressed twice")
        assert changed and not again and same == first  # the one standing; the second press is audited
        assert [(e.kind, e.to_state, e.figures["changed"]) for e in registry.events()] == [
            ("estop", first.id, 1.0), ("estop", first.id, 0.0)]
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):  # not just the code: the file refuses it
            registry._db.execute("INSERT INTO estops (id, target, who, why, t_ns) VALUES ('x', 'all', 'w', '', 1)")
        other, changed = registry.estop("session=s-1", who="operator:ada", why="")
        assert changed and other.id != first.id
        registry.release("all", who="operator:ada", why="over")
        assert registry.release("all", who="operator:ada", why="over") == (None, False)
        renewed, changed = registry.estop("all", who="operator:ada", why="again")
        assert changed and renewed.id not in (first.id, other.id)
        assert [r.target for r in registry.standing_estops()] == ["session=s-1", "all"]


def test_a_release_whose_audit_event_cannot_be_written_is_not_applied(path: Path):
    with Registry(path) as registry:
        record, _ = registry.estop("robot=arm_1", who="operator:ada", why="person in the cell")
        before = snapshot(registry)
        with sqlite3.connect(path) as other:  # the audit table refuses release events (as a full disk would)
            other.execute("CREATE TRIGGER no_release_audit BEFORE INSERT ON events WHEN NEW.kind = 'release' "
                          "BEGIN SELECT RAISE(ABORT, 'audit refused'); END")
        with pytest.raises(RegistryWriteFailed, match="audit refused"):
            registry.release("robot=arm_1", who="operator:bob", why="cell clear")
        assert snapshot(registry) == before  # the row still stands, no event
        assert [r.id for r in registry.standing_estops()] == [record.id] and not registry.released(record.id)
        with sqlite3.connect(path) as other:
            other.execute("DROP TRIGGER no_release_audit")
        assert registry.release("robot=arm_1", who="operator:bob", why="cell clear")[1]
        assert registry.released(record.id)


def test_an_estop_whose_audit_event_cannot_be_written_keeps_no_row(path: Path):
    with Registry(path) as registry:
        before = snapshot(registry)
        with sqlite3.connect(path) as other:
            other.execute("CREATE TRIGGER no_estop_audit BEFORE INSERT ON events WHEN NEW.kind = 'estop' "
                          "BEGIN SELECT RAISE(ABORT, 'audit refused'); END")
        with pytest.raises(RegistryWriteFailed, match="audit refused"):
            registry.estop("all", who="operator:ada", why="drill")
        assert snapshot(registry) == before and registry.standing_estops() == []


@pytest.mark.parametrize(("target", "who", "why", "named"), [
    ("robot=arm_1", "operator:ada", "x" * 513, "why"),
    ("robot=arm_1", "operator:ada", "line one\nline two", "why"),
    ("robot=arm_1", "", "no name", "who"),
    ("robot=arm_1", "o" * 257, "", "who"),
    ("cell=3", "operator:ada", "", "target"),
    ("robot=", "operator:ada", "", "target: robot"),
    ("session=a b", "operator:ada", "", "target: session"),
    ("robot=" + "r" * 129, "operator:ada", "", "target: robot"),
])
def test_bad_reasons_names_and_targets_are_refused_before_anything_changes(path: Path, target, who, why, named):
    with Registry(path) as registry:
        registry.estop("robot=arm_1", who="operator:ada", why="standing")
        before = snapshot(registry)
        for act in (registry.estop, registry.release):
            with pytest.raises(RegistryError, match=named) as refused:
                act(target, who=who, why=why)
            assert not isinstance(refused.value, RegistryWriteFailed)
            assert snapshot(registry) == before


def test_ids_stay_unique_when_the_file_is_recreated(path: Path):
    with Registry(path) as registry:
        first, _ = registry.estop("all", who="operator:ada", why="")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with Registry(path) as registry:  # a lost registry: sequence numbers start again, ids do not repeat
        second, _ = registry.estop("all", who="operator:ada", why="")
        assert second.id.split("-")[1] == first.id.split("-")[1] == "1" and second.id != first.id
        assert not registry.released(first.id)  # an id it never issued is never reported released
        registry.release("all", who="operator:ada", why="")
        assert registry.released(second.id) and not registry.released(first.id)


def test_a_registry_file_from_before_estops_gains_them(path: Path):
    with Registry(path):
        pass
    with sqlite3.connect(path) as old:  # as the file was before this table existed (same schema version)
        old.execute("DROP TABLE estops")
    with Registry(path) as registry:
        assert registry.estop("all", who="operator:ada", why="")[1]
