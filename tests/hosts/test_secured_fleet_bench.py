"""benchmarks/secured_fleet.py runs end to end with tiny numbers: every engine open and secured, on loopback and
(where namespaces can be made) between two lab hosts, and its JSON has every row with positive figures. No timing
is asserted: the figures are the benchmark's, the test only proves it measures what it says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hosts import namespaces_possible
from tether.cluster.nats import nats_server_binary
from tether.cluster.postgres import postgres_bin_dir

ROOT = Path(__file__).resolve().parents[2]
MEASURES = {"nats": ["transitions/s", "publish->ack p50", "publish->ack p99", "connect p50"],
            "pg": ["write->notified p50", "write->notified p99", "write commit p50", "connect p50"]}

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(nats_server_binary() is None, reason="nats-server is not installed"),
              pytest.mark.skipif(postgres_bin_dir() is None, reason="PostgreSQL is not installed")]


def test_secured_fleet_benchmark_reports_every_row(tmp_path):
    placements = ["loopback"] + ([] if namespaces_possible() else ["lab"])
    out = tmp_path / "secured_fleet.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "secured_fleet.py"), "--rounds", "2",
                           "--transitions", "40", "--pings", "4", "--writes", "3", "--connects", "1",
                           "--placements", ",".join(placements), "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "secured/open" in done.stdout  # the printed table
    result = json.loads(out.read_text())
    got = {(r["engine"], r["placement"], r["measure"]): r for r in result["rows"]}
    want = {(e, p, m) for e, ms in MEASURES.items() for p in placements for m in ms}
    assert set(got) == want, sorted(set(got) ^ want)
    for key, row in got.items():
        assert row["open"] > 0 and row["secured"] > 0, (key, row)
        assert row["ratio"] == pytest.approx(row["secured"] / row["open"]), (key, row)
    # every block ran: 2 rounds x placements x (nats, pg) x (open, secured), none lost a notification
    assert len(result["blocks"]) == 2 * len(placements) * 2 * 2
    assert all(b["result"].get("missed", 0) == 0 for b in result["blocks"]), result["blocks"]
    assert all(b["result"]["ack_s"]["n"] == 4 for b in result["blocks"] if b["engine"] == "nats")
