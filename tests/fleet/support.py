"""What the several-gateways tests share: gateway and client processes on loopback, and the checks of the
merged logs (bridge.experience.merge) against what the clients were told."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from bridge.common.processes import spawn
from bridge.experience import read_transitions
from bridge.experience.merge import Merged, merge_logs
from tests.support.gateways import start_gateway
from tether.stack import GatewayProcess

ROOT = Path(__file__).resolve().parents[2]


class Gateways:
    """Gateway processes `gw-0`, `gw-1`, ... on one shared registry, each with its own experience log."""

    def __init__(self, tmp: Path, triton_url: str, count: int, registry: str):
        self.tmp, self.triton_url, self.registry = tmp, triton_url, registry
        self.ports = [0] * count  # each gateway's own pick, once started (a port picked for it could be taken first)
        self.names = [f"gw-{i}" for i in range(count)]
        self.dirs = [tmp / f"experience-{i}" for i in range(count)]
        self.logs = [tmp / f"gateway-{i}.log" for i in range(count)]
        self.gateways: list[GatewayProcess] = []

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    @property
    def procs(self) -> list[subprocess.Popen]:
        return [gateway.proc for gateway in self.gateways]

    def start(self, *args: str, first: Sequence[str] = ()) -> Gateways:
        """Each with `args` (more `tether gateway` flags); gw-0 with `first` too."""
        for i, (port, name, d, log) in enumerate(zip(self.ports, self.names, self.dirs, self.logs, strict=True)):
            self.gateways.append(start_gateway(
                self.triton_url, log, "--experience-dir", d, "--registry", self.registry, "--gateway-id", name,
                "--idle-timeout-s", "0", *args, *(first if i == 0 else ()), port=port, grace_s=30))
            self.ports[i] = int(self.gateways[-1].address.rsplit(":", 1)[1])
        return self

    def stop(self) -> None:
        for proc in self.procs:  # all drain at once
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for gateway in self.gateways:
            gateway.stop()

    def merged(self) -> Merged:
        return merge_logs(self.dirs)

    def raw(self, i: int) -> list:
        return list(read_transitions(self.dirs[i]))


class Clients:
    """A `python -m tests.fleet.clients` process; its stdout lines are read on a thread."""

    def __init__(self, tmp: Path, kind: str, prefix: str, gateways: list[str], sessions: int, *extra: str,
                 host=None, env: dict[str, str] | None = None):
        """`host`: a lab host (tests/support/hosts.py) to run in; `env`: more environment (e.g. TETHER_TOKEN)."""
        self.out, self.stop_file = tmp / f"{prefix}.json", tmp / "stop"
        cmd = [sys.executable, "-m", "tests.fleet.clients", kind, "--gateways", ",".join(gateways), "--sessions",
               str(sessions), "--prefix", prefix, "--out", str(self.out), "--stop", str(self.stop_file), *extra]
        self.proc = spawn(
            host.command(cmd) if host is not None else cmd,
            cwd=ROOT, stdout=subprocess.PIPE, stderr=open(tmp / f"{prefix}.log", "w"), text=True,  # noqa: SIM115
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        self.lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.last: dict[str, str] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_for(self, word: str, timeout: float, check=lambda rest: True) -> str:
        """The rest of the first line starting with `word` that `check` accepts."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and self.lines.empty():
                raise AssertionError(f"clients {self.out.stem}: no '{word}' line within {timeout:g} s "
                                     f"(exit {self.proc.poll()}); last: {self.last}")
            try:
                line = self.lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            head, _, rest = line.partition(" ")
            self.last[head] = rest
            if head == word and check(rest):
                return rest

    def finish(self, timeout: float = 60) -> list[dict]:
        self.stop_file.touch()
        self.wait_for("done", timeout)
        self.proc.wait(timeout)
        return json.loads(self.out.read_text())

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def moved_and_resumed(expected: int):
    """A `wait_for` check: `moved N resumed M` with both at `expected`."""
    def check(rest: str) -> bool:
        words = rest.split()
        return int(words[0]) >= expected and int(words[2]) >= expected
    return check


def check_merged(merged: Merged, sessions: list[dict], *, live_version: int) -> dict:
    """Every step a client was told durable is in the merged logs exactly once; every logged step was answered
    with an action (none invented), and all but each session's last answered step are logged (none lost:
    the last one's transition needs the next observation); every action came from the live version."""
    by_session: dict[str, list[int]] = {}
    for t in merged.transitions:
        by_session.setdefault(t.session, []).append(t.step)
        assert t.policy_version == live_version, (t.session, t.step, t.policy_version)
    lost = doubled = 0
    for s in sessions:
        logged = by_session.get(s["id"], [])
        doubled += len(logged) - len(set(logged))
        answered = set(s["answered"])
        acknowledged = {x for x in answered if x < s["durable_through"]}
        missing = acknowledged - set(logged)
        lost += len(missing)
        assert not missing, f"{s['id']}: acknowledged steps {sorted(missing)[:10]} are not in the merged logs"
        answered_late = answered | set(s["resent"])  # the edge's flight at a break: answered, the reply late
        assert set(logged) <= answered_late, f"{s['id']}: steps logged, never answered: {set(logged) - answered_late}"
        unlogged = answered - set(logged)
        assert unlogged <= {max(answered)}, f"{s['id']}: answered steps {sorted(unlogged)[:10]} not logged"
        assert set(s["versions"]) == {str(live_version)}, (s["id"], s["versions"])
    assert doubled == 0
    return {"sessions": len(sessions), "lost": lost, "doubled": doubled, **merged.summary()}


def p50_p99_ms(seconds: list[float]) -> dict:
    from bridge.common.percentiles import p50_p99

    p50, p99 = p50_p99(seconds)
    return {"n": len(seconds), "p50_ms": round(p50 * 1e3, 1), "p99_ms": round(p99 * 1e3, 1),
            "max_ms": round(max(seconds) * 1e3, 1)}
