"""The registry file: legal and illegal moves, rollback, audit events, pins, canary settings, reopening, bad input."""

from __future__ import annotations

import itertools
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from bridge.gateway.errors import GatewayError
from bridge.registry import MOVES, DuplicateVersion, Registry, RegistryError, State, UnknownVersion
from tests.registry.helpers import POLICY, add, digest, reach, serving


@pytest.fixture
def registry(tmp_path: Path):
    with Registry(tmp_path / "registry.sqlite") as registry:
        yield serving(registry)


def snapshot(registry: Registry) -> tuple:
    return registry.versions(POLICY), registry.rollout(POLICY), registry.events(limit=10_000)


@pytest.mark.parametrize(("start", "to"), [(s, t) for s, t in itertools.product(State, State) if t in MOVES[s]])
def test_every_legal_move(registry: Registry, start: State, to: State):
    version = reach(registry, start)
    assert registry.get(POLICY, version).state is start
    before = registry.events()[-1].id
    record = registry.move(POLICY, version, to, who="operator:bob", why=f"test {start} -> {to}")
    assert record.state is to and registry.get(POLICY, version).state is to
    moved = [e for e in registry.events(since_id=before) if e.version == version and e.kind == "state"]
    assert [(e.from_state, e.to_state, e.who, e.why) for e in moved] == [
        (str(start), str(to), "operator:bob", f"test {start} -> {to}")]
    rollout = registry.rollout(POLICY)
    assert rollout.live is not None, "a policy that had a live version always has one"
    states = {r.version: r.state for r in registry.versions(POLICY)}
    for slot in (State.LIVE, State.CANARY, State.SHADOW):
        holders = [v for v, s in states.items() if s is slot]
        assert holders == ([getattr(rollout, str(slot))] if getattr(rollout, str(slot)) is not None else [])


@pytest.mark.parametrize(("start", "to"), [(s, t) for s, t in itertools.product(State, State) if t not in MOVES[s]])
def test_every_illegal_move_is_refused_and_changes_nothing(registry: Registry, start: State, to: State):
    version = reach(registry, start)
    before = snapshot(registry)
    with pytest.raises(RegistryError) as info:
        registry.move(POLICY, version, to, who="operator:bob", why="try")
    message = str(info.value)
    assert f"v{version}" in message and f"is {start}" in message and f"move to {to}" in message
    assert info.value.status == grpc.StatusCode.FAILED_PRECONDITION and isinstance(info.value, GatewayError)
    assert snapshot(registry) == before


def test_promotions_replace_the_slot_holder_and_rollback_restores_previous_live(registry: Registry):
    for v in (2, 3, 4):
        add(registry, v)
        registry.move(POLICY, v, State.GATED, who="gate", why="passed")
    registry.move(POLICY, 2, State.SHADOW, who="auto", why="staged")
    registry.move(POLICY, 3, State.SHADOW, who="auto", why="staged")  # v2 retired: "replaced by v3"
    assert registry.get(POLICY, 2).state is State.RETIRED
    assert registry.events(POLICY)[-2].why == "replaced by v3"
    registry.move(POLICY, 3, State.CANARY, who="auto", why="shadow ok")
    assert (registry.rollout(POLICY).shadow, registry.rollout(POLICY).canary) == (None, 3)
    registry.move(POLICY, 3, State.LIVE, who="auto", why="canary ok")
    rollout = registry.rollout(POLICY)
    assert (rollout.live, rollout.previous_live, rollout.canary) == (3, 1, None)
    assert registry.get(POLICY, 1).state is State.RETIRED
    registry.move(POLICY, 4, State.LIVE, who="operator:alice", why="skip the canary")
    assert (registry.rollout(POLICY).live, registry.rollout(POLICY).previous_live) == (4, 3)

    mark = registry.events()[-1].id
    with pytest.raises(RegistryError, match="figure 'ratio' = 'low' is not a number"):
        registry.move(POLICY, 4, State.ROLLED_BACK, who="auto", why="x", figures={"ratio": "low"})
    registry.move(POLICY, 4, State.ROLLED_BACK, who="auto", why="episode return 12 vs 480",
                  figures={"return_ratio": 0.025, "episodes": 10})
    rollout = registry.rollout(POLICY)
    assert (rollout.live, rollout.previous_live) == (3, 1), "v3 restored; v1 is the next rollback target"
    assert [(e.version, e.from_state, e.to_state, e.who) for e in registry.events(since_id=mark)] == [
        (4, "live", "rolled_back", "auto"), (3, "retired", "live", "auto")]
    assert "episode return 12 vs 480" in registry.events()[-1].why
    assert registry.events()[-2].figures == {"return_ratio": 0.025, "episodes": 10.0}

    registry.move(POLICY, 3, State.RETIRED, who="operator:alice", why="withdraw")  # retiring the live restores too
    assert (registry.rollout(POLICY).live, registry.rollout(POLICY).previous_live) == (1, None)
    with pytest.raises(RegistryError, match="no previous live version"):
        registry.move(POLICY, 1, State.ROLLED_BACK, who="auto", why="regressed")
    assert registry.rollout(POLICY).live == 1
    registry.move(POLICY, 3, State.LIVE, who="operator:alice", why="manual restore of a retired version")
    assert (registry.rollout(POLICY).live, registry.rollout(POLICY).previous_live) == (3, 1)


def test_add_validates_and_registers(registry: Registry):
    record = add(registry, 2)
    assert (record.state, record.sha256, record.format) == (State.CANDIDATE, digest(2), "safetensors")
    assert record.lineage == {"parent": 1, "trainer_step": 200} and record.inputs[0]["shape"] == [11]
    assert record.created_ns == record.updated_ns > 0 and record.gate == [] and record.gate_passed is None
    event = registry.events()[-1]
    assert (event.version, event.kind, event.to_state, event.who, event.why) == (2, "state", "candidate",
                                                                                 "trainer:0", "published")
    with pytest.raises(DuplicateVersion, match="'hopper' already has version 2") as info:
        add(registry, 2)
    assert info.value.status == grpc.StatusCode.ALREADY_EXISTS
    before = snapshot(registry)
    good = dict(sha256=digest(3), format="safetensors", lineage={}, inputs=[], outputs=[], who="trainer:0")
    for bad, match in [
        (dict(policy="bad name"), "policy name 'bad name'"),
        (dict(policy="../x"), r"policy name '\.\./x'"),
        (dict(version=0), "version 0 is not"),
        (dict(version=True), "version True is not"),
        (dict(version="3"), "version '3' is not"),
        (dict(sha256="xyz"), "sha256 'xyz'"),
        (dict(format=""), "format ''"),
        (dict(lineage=[1]), "lineage .* must be a dict"),
        (dict(inputs=["observation"]), "inputs .* must be a list of dicts"),
        (dict(lineage={"step": object()}), "lineage .* is not JSON-serialisable"),
        (dict(who=""), "who ''"),
        (dict(state="bogus"), "state 'bogus' is not one of"),
        (dict(state=State.RETIRED), "cannot start as retired"),
    ]:
        kwargs = {"policy": POLICY, "version": 3, **good, **bad}
        with pytest.raises(RegistryError, match=match):
            registry.add(kwargs.pop("policy"), kwargs.pop("version"), **kwargs)
    assert snapshot(registry) == before


def test_add_as_live_replaces_the_live_version(registry: Registry):
    add(registry, 2, state=State.LIVE, who="gateway")
    assert (registry.rollout(POLICY).live, registry.rollout(POLICY).previous_live) == (2, 1)
    assert [e.to_state for e in registry.events(POLICY)[-3:]] == ["candidate", "retired", "live"]


def test_gate_results_are_appended_with_an_audit_event(registry: Registry):
    add(registry, 2)
    checks = [{"name": "integrity", "passed": True, "figures": {"nonfinite": 0}, "detail": "sha256 ok"},
              {"name": "consistency", "passed": False, "figures": {"max_abs_error": 0.5, "max_rel_error": float("inf")},
               "detail": "max abs error 0.5 > 1e-5", "skipped": False}]
    record = registry.record_gate(POLICY, 2, checks)
    assert [c["name"] for c in record.gate] == ["integrity", "consistency"] and record.gate_passed is False
    assert record.gate[1]["figures"]["max_rel_error"] == float("inf") and record.gate[1]["skipped"] is False
    event = registry.events()[-1]
    assert (event.kind, event.version, event.from_state, event.to_state, event.who) == (
        "gate", 2, "candidate", "candidate", "gate")
    assert event.why == "failed: consistency" and "consistency: FAILED max abs error" in event.detail
    assert event.figures == {"integrity.nonfinite": 0.0, "consistency.max_abs_error": 0.5,
                             "consistency.max_rel_error": float("inf")}
    record = registry.record_gate(POLICY, 2, [{"name": "evaluation", "passed": True, "figures": {}, "detail": ""}])
    assert len(record.gate) == 3
    before = snapshot(registry)
    for bad, match in [([], "non-empty list"), ([{"name": "x", "passed": 1, "figures": {}, "detail": ""}], "passed 1"),
                       ([{"name": "x", "passed": True, "figures": {"a": "1"}, "detail": ""}], "figure 'a' = '1'"),
                       ([{"name": "a.b", "passed": True, "figures": {}, "detail": ""}], "name 'a.b'"),
                       ([{"name": "x", "passed": True, "figures": {}, "detail": None}], "detail None")]:
        with pytest.raises(RegistryError, match=match):
            registry.record_gate(POLICY, 2, bad)
    with pytest.raises(UnknownVersion, match="'hopper' has no version 9"):
        registry.record_gate(POLICY, 9, checks)
    assert snapshot(registry) == before


def test_canary_settings(registry: Registry):
    reach(registry, State.CANARY)
    rollout = registry.set_canary(POLICY, fraction=0.25, who="operator:alice", why="a quarter")
    assert (rollout.canary, rollout.canary_fraction, rollout.canary_labels) == (2, 0.25, {})
    rollout = registry.set_canary(POLICY, labels={"robot": "arm_2"}, who="operator:alice", why="one arm")
    assert (rollout.canary_fraction, rollout.canary_labels) == (0.25, {"robot": "arm_2"})
    event = registry.events()[-1]
    assert (event.kind, event.version, event.who, event.why) == ("canary", 2, "operator:alice", "one arm")
    assert event.detail == "fraction 0.25 -> 0.25; labels {} -> {robot=arm_2}" and event.figures["fraction"] == 0.25
    before = snapshot(registry)
    for kwargs, match in [(dict(fraction=1.5), "fraction 1.5"), (dict(fraction=-0.1), "fraction -0.1"),
                          (dict(fraction=float("nan")), "fraction nan"), (dict(fraction=True), "fraction True"),
                          (dict(labels={f"k{i}": "v" for i in range(17)}), "17 pairs"),
                          (dict(labels={"robot": "x" * 65}), "value of 'robot' 'xxx.* is not 1..64"),
                          (dict(labels={"a b": "c"}), "key 'a b' is not 1..64 characters \\(printable, no spaces"),
                          (dict(labels={"a=b": "c"}), "no '='"), (dict(labels={"robot": "\n"}), "printable"),
                          (dict(labels=["robot"]), "must be a mapping")]:
        with pytest.raises(RegistryError, match=match):
            registry.set_canary(POLICY, **kwargs, who="operator:alice", why="bad")
    assert snapshot(registry) == before
    with pytest.raises(UnknownVersion, match="'walker' has no versions"):
        registry.set_canary("walker", fraction=0.1, who="operator:alice", why="no such policy")


def test_pins(registry: Registry):
    reach(registry, State.CANARY)
    rollout = registry.pin(POLICY, "session=arm_2/0", 2, who="gate", why="evaluation")
    rollout = registry.pin(POLICY, "robot=arm_3", 1, who="operator:alice", why="hold arm_3")
    assert rollout.pins == {"robot=arm_3": 1, "session=arm_2/0": 2}
    event = registry.events()[-1]
    assert (event.kind, event.version, event.from_state, event.to_state, event.detail) == (
        "pin", 1, "", "v1", "robot=arm_3")
    rollout = registry.pin(POLICY, "robot=arm_3", None, who="operator:alice", why="release")
    assert rollout.pins == {"session=arm_2/0": 2}
    # what Hello accepts can be pinned: any printable id without spaces, label values with spaces and "="
    rollout = registry.pin(POLICY, "site=Lab A=west", 1, who="operator:alice", why="hold")
    rollout = registry.pin(POLICY, "session=arm#2=ü", 1, who="operator:alice", why="hold")
    assert rollout.pins["site=Lab A=west"] == rollout.pins["session=arm#2=ü"] == 1
    for selector in ("site=Lab A=west", "session=arm#2=ü"):
        registry.pin(POLICY, selector, None, who="operator:alice", why="release")
    assert (registry.events()[-1].from_state, registry.events()[-1].to_state) == ("v1", "")
    before = snapshot(registry)
    for selector, version, error, match in [
        ("robot", 1, RegistryError, "selector 'robot'"), ("a b=c", 1, RegistryError, "key 'a b'"),
        ("=x", 1, RegistryError, "key ''"), ("session=a b", 1, RegistryError, "session id 'a b'"),
        ("session=" + "s" * 129, 1, RegistryError, "session id"), ("robot=arm_9", None, RegistryError, "no pin"),
        ("robot=arm_9", 7, UnknownVersion, "no version 7"), ("robot=arm_9", 0, RegistryError, "version 0")]:
        with pytest.raises(error, match=match):
            registry.pin(POLICY, selector, version, who="operator:alice", why="bad")
    assert snapshot(registry) == before
    # a rolled-back version loses its pins, each with an event; withdrawn versions cannot be pinned
    registry.move(POLICY, 2, State.ROLLED_BACK, who="auto", why="errors")
    assert registry.rollout(POLICY).pins == {}
    event = registry.events()[-1]
    assert (event.kind, event.detail, event.from_state, event.who, event.why) == (
        "pin", "session=arm_2/0", "v2", "auto", "v2 rolled_back")
    with pytest.raises(RegistryError, match="v2 is rolled_back; it cannot be pinned"):
        registry.pin(POLICY, "session=arm_2/0", 2, who="operator:alice", why="again")


def test_reads_and_events_paging(registry: Registry):
    add(registry, 2, policy="walker", state=State.LIVE)
    reach(registry, State.SHADOW)
    assert registry.policies() == ["hopper", "walker"]
    assert [r.version for r in registry.versions(POLICY)] == [1, 2] and registry.versions("nope") == []
    with pytest.raises(UnknownVersion, match="policy 'hopper' has no version 5 in the registry \\(known: 1, 2\\)") as e:
        registry.get(POLICY, 5)
    assert e.value.status == grpc.StatusCode.NOT_FOUND
    with pytest.raises(UnknownVersion, match="'nope' has no versions"):
        registry.rollout("nope")
    every = registry.events(limit=10_000)
    assert [e.id for e in every] == sorted(e.id for e in every) and len(every) == 7
    assert {e.policy for e in registry.events("walker")} == {"walker"}
    assert registry.events(since_id=every[2].id, limit=2) == every[3:5]
    assert registry.events(POLICY, version=2) == [e for e in every if e.policy == POLICY and e.version == 2]
    with pytest.raises(RegistryError, match="need the policy"):
        registry.events(version=2)
    for kwargs, match in [(dict(limit=0), "limit 0"), (dict(limit=10_001), "limit 10001"),
                          (dict(since_id=-1), "since_id -1")]:
        with pytest.raises(RegistryError, match=match):
            registry.events(**kwargs)


def test_reopen_restores_everything(tmp_path: Path):
    path = tmp_path / "registry.sqlite"
    with Registry(path) as registry:
        serving(registry)
        reach(registry, State.CANARY)
        registry.set_canary(POLICY, fraction=0.3, labels={"site": "lab"}, who="operator:alice", why="lab only")
        registry.pin(POLICY, "session=s1", 1, who="operator:alice", why="hold")
        registry.record_gate(POLICY, 2, [{"name": "integrity", "passed": True, "figures": {"x": 1.0}, "detail": ""}])
        before = snapshot(registry)
    registry.close()  # again: nothing
    for call in (lambda: registry.rollout(POLICY), lambda: registry.versions(POLICY), registry.policies,
                 registry.events, lambda: add(registry, 9)):
        with pytest.raises(RegistryError, match="registry.sqlite' is closed"):
            call()
    with Registry(path) as reopened:
        assert snapshot(reopened) == before
        rollout = reopened.rollout(POLICY)
        assert (rollout.live, rollout.canary, rollout.canary_fraction, rollout.canary_labels, rollout.pins) == (
            1, 2, 0.3, {"site": "lab"}, {"session=s1": 1})
        assert reopened.get(POLICY, 2).gate[0]["figures"] == {"x": 1.0}


def test_a_write_by_another_process_shows_at_once(tmp_path: Path):
    path = tmp_path / "registry.sqlite"
    with Registry(path) as reader, Registry(path) as writer:
        serving(writer)
        assert reader.rollout(POLICY).live == 1  # now cached
        reach(writer, State.LIVE)
        assert reader.rollout(POLICY).live == 2
        reader.rollout(POLICY).pins["session=x"] = 1  # a copy: the cache is not changed through it
        assert reader.rollout(POLICY).pins == {}


def test_files_that_are_not_a_registry(tmp_path: Path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(RegistryError, match="junk.sqlite"):
        Registry(junk)
    assert junk.read_bytes() == b"not a database at all" * 100
    newer = tmp_path / "newer.sqlite"
    with sqlite3.connect(newer) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(RegistryError, match=r"schema 99, newer than this code.s \d+"):
        Registry(newer)
    with pytest.raises(RegistryError, match="cannot open"):
        Registry(tmp_path / "no" / "such" / "dir" / "registry.sqlite")



def test_threads_share_one_registry(registry: Registry):
    """The gateway writes from worker threads (asyncio.to_thread): every change lands, one transaction each."""

    def publish(first: int) -> None:
        for version in range(first, first + 40, 4):
            add(registry, version)
            registry.move(POLICY, version, State.GATED, who="gate", why="passed")
            registry.move(POLICY, version, State.LIVE, who="auto", why="direct")

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(publish, (2, 3, 4, 5)))
    records = registry.versions(POLICY)
    assert [r.version for r in records] == list(range(1, 42))
    assert [r.version for r in records if r.state is State.LIVE] == [registry.rollout(POLICY).live]
    assert len(registry.events(POLICY, limit=10_000)) == 2 + 40 * 4  # candidate, gated, retired-by, live


def test_in_memory_registry():
    with Registry(":memory:") as registry:
        serving(registry)
        assert registry.rollout(POLICY).live == 1 and not Path(":memory:").exists()


def test_a_full_disk_keeps_nothing_of_the_change(registry: Registry):
    reach(registry, State.CANARY)
    before = snapshot(registry)
    pages = registry._db.execute("PRAGMA page_count").fetchone()[0]
    registry._db.execute(f"PRAGMA max_page_count = {pages + 2}")  # SQLite's own "database or disk is full"
    big = {"notes": "x" * 500_000}
    with pytest.raises(RegistryError, match="cannot write the registry .*full"):
        registry.add(POLICY, 3, sha256=digest(3), format="safetensors", lineage=big, inputs=[], outputs=[],
                     who="trainer:0")
    assert snapshot(registry) == before
    registry._db.execute("PRAGMA max_page_count = 1073741823")
    registry.move(POLICY, 2, State.LIVE, who="auto", why="still works")
    assert registry.rollout(POLICY).live == 2


def test_operator_events_without_a_state_change_are_audited_and_checked(registry: Registry, tmp_path: Path):
    registry.record_event(kind="estop", who="operator:ada", why="person in the cell", detail="robot=arm_2")
    registry.record_event(kind="release", policy=POLICY, version=1, who="operator:ada", why="clear",
                          figures={"sessions": 2})
    estop, release = [e for e in registry.events() if e.kind in ("estop", "release")]
    assert (estop.policy, estop.version, estop.who, estop.detail) == ("", None, "operator:ada", "robot=arm_2")
    assert (release.policy, release.version, release.figures) == (POLICY, 1, {"sessions": 2.0})
    for bad, named in [(dict(kind="state"), "kind"), (dict(kind="E-STOP"), "kind"), (dict(kind="estop", who=""), "who"),
                       (dict(kind="estop", version=0), "version"), (dict(kind="estop", policy="../x"), "policy")]:
        with pytest.raises(RegistryError, match=named):
            registry.record_event(**{"who": "operator:ada", "why": "x", **bad})
    registry.close()
    assert [e.kind for e in Registry(tmp_path / "registry.sqlite").events() if e.kind in ("estop", "release")] == [
        "estop", "release"]
