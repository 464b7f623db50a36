"""`tether cluster up` as a real process: PostgreSQL, a 3-server NATS cluster, a Triton and two gateways start
and print their addresses; one sim session steps through a gateway; SIGINT stops every process (each role's
process group is gone afterwards). Small numbers (no trainer nodes: tests/trainer/test_elastic.py covers them)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import sim
from bridge.client.session import SessionError
from bridge.common.processes import group_members, spawn, stop_group
from bridge.security.lab import LabCredentials
from sim.client import ClientTls, run_sessions
from tests.support.cluster import needs_cluster
from tests.support.waiting import wait_until
from tether.cluster.nats import NatsSecurity

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
ENV = "InvertedPendulum-v5"


async def _stream_messages(url: str, auth) -> int:
    from bridge.experience.jetstream import STREAM, connect

    nc = await connect(url.split(","), name="test_cluster_up", auth=auth)
    try:
        return (await nc.jetstream().stream_info(STREAM)).state.messages
    finally:
        await nc.close()


@needs_cluster
def test_cluster_up_serves_a_session_and_ctrl_c_stops_every_process(tmp_path):
    summary = tmp_path / "up.json"
    out = open(tmp_path / "up.log", "w")  # noqa: SIM115 - closed below
    proc = spawn([sys.executable, "-m", "tether", "cluster", "up", "--gateways", "2", "--tritons", "1",
                  "--trainer-nodes", "0", "--run-dir", str(tmp_path / "run"), "--summary", str(summary)],
                 cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    pids: list[int] = []
    try:
        wait_until(lambda: summary.exists() or proc.poll() is not None,
                   lambda: "the cluster up: " + (tmp_path / "up.log").read_text()[-4000:], timeout=240, period=0.2)
        assert proc.poll() is None, (tmp_path / "up.log").read_text()[-4000:]
        roles = {r["role"]: r for r in json.loads(summary.read_text())["roles"]}
        pids = [p for r in roles.values() for p in r["pids"]]
        assert list(roles) == ["postgres", "nats", "triton-0", "gateway-0", "gateway-1"]
        # every engine with the run's credentials (tether cluster certs): the gateways log in as the least-privilege
        # role over verify-full TLS, NATS is TLS, sessions need a robot token over TLS
        assert roles["postgres"]["address"].startswith("postgresql://tether_gateway@127.0.0.1:")
        assert "sslmode=verify-full" in roles["postgres"]["address"]
        assert roles["nats"]["address"].startswith("tls://")
        creds = LabCredentials(tmp_path / "run" / "credentials")
        assert len(roles["nats"]["address"].split(",")) == 3 and len(roles["nats"]["pids"]) == 3
        printed = (tmp_path / "up.log").read_text()
        assert all(r["address"] in printed for r in roles.values())  # the table names every address
        secrets = [creds.pg_password("gateway"), creds.pg_password("admin"), creds.nats_password("gateway"),
                   creds.token("sim"), creds.rendezvous_id_file.read_text()]
        assert not any(secret in printed for secret in secrets), "a secret in cluster up's output"
        with pytest.raises(SessionError, match="UNAUTHENTICATED"):   # no robot token: no session
            asyncio.run(run_sessions(roles["gateway-0"]["address"], lambda i: sim.make(ENV, seed=i), envs=1, steps=1,
                                     tls=ClientTls(ca=creds.ca)))

        sessions: list = []
        stats = asyncio.run(run_sessions(roles["gateway-1"]["address"], lambda i: sim.make(ENV, seed=i), envs=1,
                                         steps=50, sessions_out=sessions, tls=ClientTls(ca=creds.ca),
                                         token=creds.token("sim")))
        assert stats.steps == 50 and not stats.errors
        # the gateways are wired to the shared services: the session's owner is in PostgreSQL, its steps in the stream
        with psycopg.connect(roles["postgres"]["address"], passfile=str(creds.pgpass("gateway"))) as db:
            owners = dict(db.execute("SELECT session, owner FROM session_owners").fetchall())
        assert owners.get(sessions[0].id) == "gateway-1", owners
        assert asyncio.run(_stream_messages(roles["nats"]["address"], NatsSecurity.from_folder(creds.folder)
                                            .auth("gateway"))) >= 50

        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, (tmp_path / "up.log").read_text()[-4000:]
        assert "cluster stopped" in (tmp_path / "up.log").read_text()
        left = {p: group_members(p) for p in pids if group_members(p)}
        assert not left, f"processes left behind: {left}"
    finally:
        stop_group(proc, grace_s=120)
        for pid in pids:  # whatever a failed stop left
            for member in group_members(pid):
                subprocess.run(["kill", "-9", str(member)], check=False)
        out.close()
