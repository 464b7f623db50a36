"""A process killed (SIGKILL) while it writes leaves a registry that opens, is intact, and holds every change it
reported committed, each with its audit events (a change and its events are one transaction).
The writer imports bridge.registry first in a fresh interpreter: the import cycle with bridge.gateway is covered."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from bridge.registry import Registry, State
from tests.registry.helpers import POLICY

WRITER = Path(__file__).with_name("writer.py")


def test_killed_mid_write_leaves_a_readable_registry(tmp_path: Path):
    path = tmp_path / "registry.sqlite"
    child = subprocess.Popen([sys.executable, str(WRITER), str(path)], stdout=subprocess.PIPE, text=True)
    reported = []
    try:
        while len(reported) < 60:  # bounded: the writer reports every commit, or ends (EOF)
            line = child.stdout.readline()
            if not line:
                break
            reported.append(line.split())
        assert len(reported) == 60, f"the writer stopped early (exit {child.poll()})"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        # what it reported between the 60th line and the kill: the last report must be the last one made
        reported += [line.split() for line in child.stdout.read().splitlines()]
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    reported = [r for r in reported if len(r) == 2]  # (a line cut by the kill, were there one)

    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with Registry(path) as registry:
        records = {r.version: r for r in registry.versions(POLICY)}
        last_version, last_step = int(reported[-1][0]), reported[-1][1]
        assert set(records) >= set(range(1, last_version + 1)), "a reported commit was lost"
        if last_step in ("live", "pinned"):
            assert records[last_version].state is State.LIVE
        live = [v for v, r in records.items() if r.state is State.LIVE]
        assert live == [registry.rollout(POLICY).live] and live[0] >= last_version - (last_step != "live")
        events = registry.events(POLICY, limit=10_000)
        for version, record in records.items():
            moves = [e for e in events if e.version == version and e.kind == "state"]
            assert moves[-1].to_state == record.state, f"v{version}: state and audit log disagree"
            assert all(a.to_state == b.from_state for a, b in zip(moves, moves[1:], strict=False))
            assert len(record.gate) == sum(8 for e in events if e.version == version and e.kind == "gate")
        assert all(registry.get(POLICY, v).state is not State.REJECTED for v in registry.rollout(POLICY).pins.values())
        # and it keeps working
        registry.move(POLICY, live[0], State.ROLLED_BACK, who="auto", why="after the crash")
        assert registry.rollout(POLICY).live == live[0] - 1
