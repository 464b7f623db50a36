"""The event loop never waits on the database, on lab hosts (issue 23): tests/fleet/test_registry_outage.py's
scenario with PostgreSQL (scram + TLS) on a `db` host taken off the network by `lab.partition(db)` (packets
dropped, no reset) and brought back by `lab.heal(db)`, Triton and two TLS gateways each on a host of their own.

8 sessions (4 on each gateway, 50 Hz, the robot's token) and the operator's calls (its token: Fleet.Status on
both gateways, gw0's console over HTTPS, a promote, an e-stop) run in one process on a `robots` host, the
loopback test's `_scenario`; it asks this test to partition and heal the db host (a line on its stdout, `ok` back
on its stdin once done) and prints its figures. Bounds as on loopback (`check_bounds`): the step round trip's p99
in the partition within 2x of before, the status reads under 0.5 s, a promote refused with UNAVAILABLE "registry
unreachable", the e-stop held on gw0 within 100 ms and on gw1 within 2 s after the heal; its row is in `estops`.

    python -m tests.hosts.test_database_partition --gateways A,B --console https://H:P --ca CA \
        --robot-token-file F --operator-token-file F --registry URL     # the robots host's side
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from bridge.client import Credentials
from tests.fleet.test_registry_outage import _scenario, check_bounds
from tests.hosts.fleet import ROOT, Placed
from tests.support.hosts import Host, Lab, namespaces_possible

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(namespaces_possible()), reason=namespaces_possible() or "-")]

CONSOLE_PORT = 8443
DRIVER_TIMEOUT_S = 300.0


def test_the_database_host_partitioned_while_8_sessions_step(tmp_path):
    with Lab() as lab, Placed(lab, tmp_path) as fleet:
        triton = fleet.triton(lab.host("triton"))
        db = lab.host("db")
        registry = fleet.role("postgres", db)   # the gateway role's URL: verify-full, its passfile in it
        hosts = [lab.host("gw0"), lab.host("gw1")]
        console = ["--console-host", hosts[0].address(), "--console-port", str(CONSOLE_PORT)]
        gateways = [fleet.gateway(h, triton, "--registry", registry, "--idle-timeout-s", "0",
                                  *(console if i == 0 else ())) for i, h in enumerate(hosts)]
        figures = _drive(lab, db, lab.host("robots"), tmp_path, [
            "--gateways", ",".join(gateways), "--console", f"https://{hosts[0].address()}:{CONSOLE_PORT}",
            "--ca", str(fleet.creds.ca), "--robot-token-file", str(fleet.creds.token_file("sim")),
            "--operator-token-file", str(fleet.creds.token_file("operator")), "--registry", registry])
    print("\ndatabase host partitioned while 8 sessions step:", json.dumps(figures))
    assert figures["estops"] == [[figures["estop_id"], "robot=arm-e", None]], figures["estops"]
    check_bounds(figures)


def _drive(lab: Lab, db: Host, robots: Host, tmp: Path, args: list[str]) -> dict:
    """Run the scenario on `robots`; partition / heal `db` when it asks; its figures."""
    log = tmp / "robots.log"
    proc = robots.popen([sys.executable, "-m", "tests.hosts.test_database_partition", *args], cwd=ROOT, text=True,
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "w"),  # noqa: SIM115
                        start_new_session=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()

    def read():
        for line in proc.stdout:
            lines.put(line.strip())
        lines.put(None)
    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    at: dict[str, str] = {}  # when the db host was partitioned / healed, to read the engines' logs by
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                raise AssertionError(f"the robots host's scenario ended without figures (exit {proc.poll()}); "
                                     f"log:\n{log.read_text()[-4000:]}")
            word, _, rest = line.partition(" ")
            if word in ("block", "unblock"):
                (lab.partition if word == "block" else lab.heal)(db)
                now = time.time()
                at["db_partitioned_at" if word == "block" else "db_healed_at"] = \
                    time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
                proc.stdin.write("ok\n")
                proc.stdin.flush()
            elif word == "figures":
                proc.wait(60)
                return {**json.loads(rest), **at}
    finally:
        lab.heal(db)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


class AskTheLab:
    """The scenario's `proxy` on the robots host: `block()` / `unblock()` ask the test to partition / heal the db
    host and return once it says it did."""

    def _ask(self, word: str) -> None:
        print(word, flush=True)
        answer = sys.stdin.readline().strip()
        assert answer == "ok", f"the lab did not {word}: {answer!r}"

    def block(self) -> None:
        self._ask("block")

    def unblock(self) -> None:
        self._ask("unblock")


def console_getter(base: str, ca: Path, token: str) -> Callable[[str], bytes]:
    """GET `path` of the console at `base` (https://HOST:PORT) over TLS verified with `ca`, with the token."""
    context = ssl.create_default_context(cafile=str(ca))

    def get(path: str) -> bytes:
        request = urllib.request.Request(base + path, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.read()
    return get


def main(argv: list[str] | None = None) -> int:
    import psycopg

    p = argparse.ArgumentParser(prog="python -m tests.hosts.test_database_partition")
    p.add_argument("--gateways", required=True, help="A,B: the two gateways")
    p.add_argument("--console", required=True, help="https://HOST:PORT of the first gateway's console")
    p.add_argument("--ca", type=Path, required=True)
    p.add_argument("--robot-token-file", type=Path, required=True)
    p.add_argument("--operator-token-file", type=Path, required=True)
    p.add_argument("--registry", required=True, help="the gateway role's URL (its passfile in it)")
    a = p.parse_args(argv)
    robot = Credentials(ca=a.ca, token=a.robot_token_file.read_text().strip())
    operator = Credentials(ca=a.ca, token=a.operator_token_file.read_text().strip())
    figures = asyncio.run(_scenario(a.gateways.split(","), AskTheLab(),
                                    console_getter(a.console, a.ca, operator.token), robot=robot, operator=operator))
    with psycopg.connect(a.registry) as conn:  # durable, after the partition
        figures["estops"] = [list(r) for r in conn.execute("SELECT id, target, released_ns FROM estops").fetchall()]
    print("figures " + json.dumps(figures), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
