"""Partitions between hosts: a link taken down and brought back (tests/support/hosts.py), real processes on
their own hosts with the lab's credentials; nothing acknowledged to a client may be lost."""

from __future__ import annotations

import json
import sys
import time

import pytest

from tests.fleet.support import Clients, check_merged, moved_and_resumed, p50_p99_ms
from tests.hosts.fleet import Placed
from tests.support.hosts import Lab, namespaces_possible

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(namespaces_possible()), reason=namespaces_possible() or "-")]


def test_a_gateway_host_partitioned_from_its_robots_they_resume_on_the_other_gateway(tmp_path):
    with Lab() as lab, Placed(lab, tmp_path) as fleet:
        triton = fleet.triton(lab.host("triton"))
        registry = fleet.role("postgres", lab.host("db"))   # the gateway role's URL (verify-full, its passfile)
        hosts = [lab.host("gw0"), lab.host("gw1")]
        gateways = [fleet.gateway(h, triton, "--registry", registry, "--idle-timeout-s", "0") for h in hosts]
        robots = lab.host("robots")
        clients = Clients(tmp_path, "sim", "robots", gateways, 8, "--reply-timeout-s", "0.3", "--tls-ca",
                          str(fleet.creds.ca), host=robots, env={"TETHER_TOKEN": fleet.creds.token("sim")})
        try:
            on_first = json.loads(clients.wait_for("ready", 120))
            assert on_first == {"gw0": 8}, on_first   # the list's first address
            partitioned_at = time.time()
            lab.partition(hosts[0])
            clients.wait_for("moved", 60, moved_and_resumed(8))
            lab.heal(hosts[0])
            sessions = clients.finish()
        finally:
            clients.kill()
            fleet.stop()
    resumes = []
    for s in sessions:
        move = s["failovers"][0]
        assert move["gateway"] == "gw1" and move["epoch"] >= 2, move
        resumes.append(move["broken_at"] + move["seconds"] - partitioned_at)
    stats = check_merged(_merged(tmp_path), sessions, live_version=1)
    figures = {"resume_from_partition": p50_p99_ms(resumes), **stats}
    print("gateway host partitioned:", json.dumps(figures), file=sys.stderr)
    assert stats["lost"] == 0 and stats["doubled"] == 0
    # target 1 s (measured 0.49-0.59 s p50, 0.66 s max); the client's reply timeout (0.3 s) is part of it
    assert figures["resume_from_partition"]["p50_ms"] < 1000 and max(resumes) < 2.0, figures


def _merged(tmp):
    from bridge.experience.merge import merge_logs

    return merge_logs([tmp / "gw0-experience", tmp / "gw1-experience"])
