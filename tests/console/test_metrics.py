"""Prometheus metrics and JSON logs while real sim processes (MuJoCo Hopper-v5, `tether sim`) run against a
real gateway + tritonserver: scraped over HTTP from the console's /metrics and parsed with prometheus_client."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bridge.common.logs import JsonFormatter
from bridge.console.fleet import Target
from tests.support.gateways import running_gateway


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[tuple[str, tuple], float]:
    async with http.get(url + "metrics") as reply:
        assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/plain")
        return samples(await reply.text())


def hop_count(m, hop: str) -> float:
    return m[("tether_hop_latency_seconds_count", (("hop", hop),))]


async def start_sim(address: str, *, envs: int, seconds: float, robot: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tether", "sim", "--gateway", address, "--env", "Hopper-v5", "--envs", str(envs),
        "--seconds", str(seconds), "--label", f"robot={robot}", "--session-id", robot, "--status-every", "100",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


def test_metrics_move_while_sims_run_and_logs_carry_the_session(triton, tmp_path):
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(self.format(record))

    handler = Collect()
    handler.setFormatter(JsonFormatter())
    gateway_log = logging.getLogger("tether.gateway")
    gateway_log.addHandler(handler)
    old_level = gateway_log.level
    gateway_log.setLevel(logging.INFO)

    async def scenario():
        async with running_gateway(triton.url, policy="tiny", console_port=0,
                                   experience_dir=tmp_path / "experience") as gw, aiohttp.ClientSession() as http:
            url = gw.console.url
            assert url.startswith("http://127.0.0.1:")
            sim = await start_sim(gw.address, envs=2, seconds=12, robot="hopper_a")
            try:
                for _ in range(300):  # both sessions stepping (bounded: 30 s)
                    if len(gw.sessions) == 2 and all(s.stats.steps > 5 for s in gw.sessions.values()):
                        break
                    assert sim.returncode is None, await sim.stderr.read()
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError("the sims did not start stepping")
                first = await scrape(http, url)
                for _ in range(100):  # until the counters move (bounded: 10 s)
                    await asyncio.sleep(0.1)
                    second = await scrape(http, url)
                    if second[("tether_steps_total", ())] > first[("tether_steps_total", ())] + 20 and \
                            second[("tether_log_bytes", ())] > first[("tether_log_bytes", ())]:  # group commits lag
                        break
                assert second[("tether_steps_total", ())] > first[("tether_steps_total", ())] + 20
                for hop in ("observation_age", "checks", "queue", "batch", "triton", "respond", "reply", "gateway"):
                    assert hop_count(second, hop) > hop_count(first, hop) > 0, hop
                    inf = second[("tether_hop_latency_seconds_bucket", (("hop", hop), ("le", "+Inf")))]
                    assert inf == hop_count(second, hop)
                    assert second[("tether_hop_latency_seconds_sum", (("hop", hop),))] > 0
                filled = [v for (name, labels), v in second.items()
                          if name == "tether_hop_latency_seconds_bucket" and ("hop", "triton") in labels
                          and ("le", "+Inf") not in labels]
                assert max(filled) > 0  # the finite buckets fill, not only +Inf
                assert second[("tether_sessions", ())] == 2 and second[("tether_envs", ())] == 2
                assert second[("tether_version_sessions", (("policy", "tiny"), ("version", "1")))] == 2
                assert second[("tether_actions_total", (("policy", "tiny"), ("version", "1")))] > 0
                assert second[("tether_policy_lag_versions", (("policy", "tiny"),))] == 0
                assert second[("tether_log_bytes", ())] > first[("tether_log_bytes", ())] >= 0
                async with http.get(url + "api/state") as reply:
                    state = await reply.json()
                rows = {r["session_id"]: r for r in state["sessions"]}
                assert set(rows) == {"hopper_a-0", "hopper_a-1"}, rows
                assert all(r["labels"]["robot"] == "hopper_a" and r["steps"] > 0 for r in rows.values())
                for r in rows.values():  # the latency budget per robot: every hop the gateway and the sim measure
                    assert {"observation_age", "checks", "queue", "batch", "triton", "respond", "reply"} <= \
                        set(r["hop_p50_ms"]), r["hop_p50_ms"]
                    assert 0 < r["hop_p50_ms"]["triton"] < 1000
                # an e-stop of the robot while it runs: the sim applies the safe actions and counts them
                await gw.fleet.estop(Target(robot="hopper_a"), who="operator:test", why="drill")
                for _ in range(200):  # bounded: 20 s
                    if all(r["held_steps"] > 5 for r in gw.fleet.sessions()):
                        break
                    await asyncio.sleep(0.1)
                await gw.fleet.release(Target(robot="hopper_a"), who="operator:test", why="drill over")
                held = (await scrape(http, url))[("tether_estop_steps_total", ())]
                assert held > 10
            finally:
                out, err = await sim.communicate()
            assert sim.returncode == 0, err.decode()[-2000:]
            summary = json.loads(out.decode().strip().splitlines()[-1])
            assert summary["held"] >= held and summary["errors"] == {}, summary

    try:
        asyncio.run(scenario())
    finally:
        gateway_log.removeHandler(handler)
        gateway_log.setLevel(old_level)
    closed = [json.loads(line) for line in lines if "closed" in line]
    assert {c["session"] for c in closed} == {"hopper_a-0", "hopper_a-1"}, lines
    assert all(c["policy"] == "tiny" and c["policy_version"] == 1 for c in closed)
