"""tether.cluster.up without processes: the declared roles, and the generic Cluster's order (start in order, each
seeing the roles before it; stop in reverse, also when a start fails, every role stopped even when one's stop
fails)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether.cluster.up import Cluster, ClusterError, ClusterSpec, Role, roles


class Fake:
    def __init__(self, name: str, log: list[str]):
        self.address, self.name, self.log = f"addr-{name}", name, log

    def pids(self) -> list[int]:
        return [1]

    def stop(self) -> None:
        self.log.append(f"stop {self.name}")
        if self.name == "bad-stop":
            raise RuntimeError("cannot stop")


def role(name: str, log: list[str], seen: dict | None = None, fail: bool = False) -> Role:
    def start(up):
        if seen is not None:
            seen[name] = sorted(up)
        if fail:
            raise RuntimeError(f"{name} failed")
        log.append(f"start {name}")
        return Fake(name, log)
    return Role(name, start)


def test_the_declared_roles_in_start_order():
    names = [r.name for r in roles(ClusterSpec(run_dir=Path("x"), gateways=2, tritons=2, trainer_nodes=2))]
    assert names == ["postgres", "nats", "triton-0", "triton-1", "gateway-0", "gateway-1", "rendezvous", "trainer-0",
                     "trainer-1"]
    assert [r.name for r in roles(ClusterSpec(run_dir=Path("x"), gateways=1, tritons=1, trainer_nodes=0))] == [
        "postgres", "nats", "triton-0", "gateway-0"]


@pytest.mark.parametrize(("field", "value"), [("gateways", 0), ("tritons", 0), ("trainer_nodes", -1),
                                              ("nats_servers", 0)])
def test_a_bad_count_is_refused_naming_the_flag(field, value):
    with pytest.raises(ValueError, match=f"--{field.replace('_', '-')} must be at least"):
        ClusterSpec(run_dir=Path("x"), **{field: value})


def test_roles_start_in_order_seeing_the_earlier_ones_and_stop_in_reverse():
    log: list[str] = []
    seen: dict = {}
    with Cluster([role("a", log, seen), role("b", log, seen), role("c", log, seen)]) as cluster:
        assert cluster.address("b") == "addr-b"
        assert "addr-c" in cluster.table() and cluster.describe()[0] == {"role": "a", "address": "addr-a", "pids": [1]}
    assert seen == {"a": [], "b": ["a"], "c": ["a", "b"]}
    assert log == ["start a", "start b", "start c", "stop c", "stop b", "stop a"]


def test_a_failed_start_stops_what_started_and_a_failed_stop_does_not_keep_the_rest_running():
    log: list[str] = []
    with pytest.raises(RuntimeError, match="c failed"):
        Cluster([role("a", log), role("b", log), role("c", log, fail=True)]).start()
    assert log == ["start a", "start b", "stop b", "stop a"]
    log.clear()
    cluster = Cluster([role("a", log), role("bad-stop", log), role("c", log)]).start()
    with pytest.raises(ClusterError, match="bad-stop: cannot stop"):
        cluster.stop()
    assert log[-3:] == ["stop c", "stop bad-stop", "stop a"] and not cluster.running


def test_role_names_are_unique():
    with pytest.raises(ValueError, match="unique"):
        Cluster([role("a", []), role("a", [])])
