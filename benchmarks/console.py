"""Control-step round trip with the operator console open and /metrics scraped, versus not, in one run.

    python benchmarks/console.py [--rounds 6 --per-round 300 --sessions 4 --json PATH]

One Triton and one gateway (`--console-port`), both subprocesses on loopback. The clients here step
`--sessions` concurrent Bridge.Connect streams; round trips are measured in blocks, in an order that
alternates round by round:
  quiet    nobody looks at the console;
  poll     /api/state (what the page polls) and /metrics fetched every `--scrape-s` s over HTTP: the
           gateway's cost of being watched from another machine (Prometheus' default is 15 s: 1 s is harsh);
  browser  the console page open in a headless Chromium (Debian's, via Playwright, in a watcher
           subprocess) on this host, polling and redrawing once a second, plus /metrics scraped:
           that includes the browser's own CPU, which competes with the gateway on a small machine.
Also measured in-process: what recording one step's figures and metrics costs (Fleet.observed), in us.
Prints a table and writes JSON (default benchmarks/results/console.json).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from bench import machine, parser, report
from loop_latency import ACT, MODEL, OBS, Session, percentiles

from bridge.common.processes import free_port
from inference_server import ModelRepository, TritonServer
from tether.topology import gateway_process
from trainer.policy import MLPPolicy

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


def watcher(url: str, scrape_s: float) -> None:
    """The watcher subprocess. Reads commands, one a line, and answers each:
    "browser": the console page open in Chromium (it polls /api/state) and /metrics scraped;
    "poll": /api/state and /metrics fetched every `scrape_s` over plain HTTP (what the gateway serves
            to a browser on another machine, without that browser's CPU on this one);
    "off", "quit"."""
    import threading

    from playwright.sync_api import sync_playwright

    mode = ["off"]
    counts = {"scrapes": 0, "state_ms": []}

    def fetch() -> None:
        while True:
            if mode[0] == "off":
                time.sleep(0.05)
                continue
            with urllib.request.urlopen(url + "metrics", timeout=10) as r:
                r.read()
            counts["scrapes"] += 1
            if mode[0] == "poll":
                t0 = time.perf_counter()
                with urllib.request.urlopen(url + "api/state", timeout=10) as r:
                    r.read()
                counts["state_ms"].append((time.perf_counter() - t0) * 1e3)
            time.sleep(scrape_s)

    threading.Thread(target=fetch, daemon=True).start()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        print("ready", flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "browser":
                page.goto(url)
                page.wait_for_function("document.body.dataset.updated > 0")  # the page drew the fleet once
            elif command in ("off", "poll"):
                page.goto("about:blank")
            mode[0] = command
            state = counts["state_ms"]
            print(f"{command} scrapes={counts['scrapes']} state_p50_ms="
                  f"{float(np.median(state)) if state else 0.0:.3f}", flush=True)
            if command == "quit":
                break
        browser.close()


class Watcher:
    def __init__(self, url: str, scrape_s: float):
        self.proc = subprocess.Popen([sys.executable, __file__, "--watcher", url, "--scrape-s", str(scrape_s)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._expect("ready")

    def _expect(self, word: str) -> str:
        line = self.proc.stdout.readline()
        if not line.startswith(word):
            raise RuntimeError(f"watcher said {line!r}, expected {word!r}")
        return line.strip()

    def send(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._expect(command)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send("quit")
        self.proc.wait(30)


async def block(address: str, sessions: int, per_session: int, tag: str) -> list[int]:
    async def one(i: int) -> list[int]:
        async with Session(address, f"{tag}-{i}") as s:
            return [await s.round_trip() for _ in range(per_session)]

    results = await asyncio.gather(*(one(i) for i in range(sessions)))
    return [x for r in results for x in r]


def recording_cost_us(n: int = 20000) -> float:
    """FleetFigures.observed on a realistic reply, us per call (the hot path's share of the console and metrics)."""
    from bridge.gateway.session.figures import FleetFigures
    from bridge.metrics import GatewayMetrics
    from protos import bridge_pb2
    from protos.codec import encode

    class _Policy:
        name, version = MODEL, 1

    class _Session:
        id, source, policy = "s", "bench", _Policy()

    class _Gateway:  # a MetricsSource (bridge.gateway.views)
        sessions, registry, rollout, experience = {}, None, None, None

    fleet = FleetFigures(GatewayMetrics(_Gateway()))
    session = _Session()
    fleet.opened(session, bridge_pb2.Hello(session_id="s"))
    now = time.time_ns()
    timing = bridge_pb2.Timing(t_sent_ns=now, gateway_recv_ns=now + 50_000, infer_start_ns=now + 60_000,
                               infer_end_ns=now + 700_000, gateway_send_ns=now + 720_000)
    reply = bridge_pb2.ServerMessage(action=bridge_pb2.Action(
        step=1, tensors=[encode("action", np.zeros(3, np.float32))], policy=MODEL, policy_version=1, timing=timing))
    obs = bridge_pb2.Observation(step=1, guard=bridge_pb2.GuardReport(clamped=1))
    best = float("inf")
    for _ in range(5):  # the least disturbed of 5 runs (a shared machine)
        t0 = time.perf_counter_ns()
        for _ in range(n // 5):
            fleet.observed(session, obs, reply)
        best = min(best, (time.perf_counter_ns() - t0) / (n // 5) / 1e3)
    return best


def main(argv: list[str] | None = None) -> dict:
    p = parser(__file__, __doc__, rounds=(6, "alternating quiet/watched blocks"),
               per_round=(300, "round trips per session per block"))
    p.add_argument("--sessions", type=int, default=4, help="concurrent sessions stepping in each block")
    p.add_argument("--scrape-s", type=float, default=1.0, help="seconds between /metrics scrapes while watched")
    p.add_argument("--watcher", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.watcher:
        watcher(a.watcher, a.scrape_s)
        return {}
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"benchmarks/console.py needs Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    run_dir = Path(tempfile.mkdtemp(prefix="tether-bench-console-"))
    repo = ModelRepository(run_dir / "models")
    repo.write_version(MODEL, 1, MLPPolicy(OBS[0], ACT[0], seed=0), OBS, ACT)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    conditions = ("quiet", "poll", "browser")
    samples: dict[str, list[int]] = {c: [] for c in conditions}
    with TritonServer(repo.root, models=[MODEL], log_path=run_dir / "triton.log") as triton, \
            gateway_process(triton_url=triton.grpc_url, policy=MODEL, log_path=run_dir / "gateway.log",
                            extra_args=("--console-port", str(port), "--deadline-ms", "2000")) as gw:
        asyncio.run(block(gw, a.sessions, 100, "warmup"))
        watch = Watcher(url, a.scrape_s)
        said = ""
        try:
            for r in range(a.rounds):
                order = conditions if r % 2 == 0 else conditions[::-1]  # drift cancels over the rounds
                for condition in order:
                    watch.send("off" if condition == "quiet" else condition)
                    samples[condition] += asyncio.run(block(gw, a.sessions, a.per_round, f"{condition}{r}"))
                said = watch.send("off")
                print(f"  round {r + 1}/{a.rounds}: p50 so far " + ", ".join(
                    f"{c} {np.median(samples[c]) / 1e6:.3f} ms" for c in conditions), flush=True)
        finally:
            watch.close()
        version = triton.version
    figures = dict(item.split("=") for item in said.split()[1:])
    lat = {c: percentiles(samples[c]) for c in conditions}
    result = {
        "machine": machine(cpus=os.cpu_count(), load_avg_1m=os.getloadavg()[0]),
        "triton_version": version, "sessions": a.sessions, "scrape_interval_s": a.scrape_s,
        "scrapes": int(figures.get("scrapes", 0)), "api_state_p50_ms": float(figures.get("state_p50_ms", 0)),
        "latency_ms": lat,
        **{f"ratio_{c}_{q}": lat[c][q] / lat["quiet"][q] for c in ("poll", "browser") for q in ("p50", "p99")},
        "recording_us_per_step": recording_cost_us(),
    }
    return report(a.json, result, print_table)


def print_table(r: dict) -> None:
    names = {"quiet": "quiet (nobody watching)", "poll": "/api/state + /metrics polled 1/s",
             "browser": "console open in chromium (this host)"}
    print(f"\n{'condition':<40}{'p50 ms':>10}{'p99 ms':>10}{'n':>8}")
    for c, name in names.items():
        lat = r["latency_ms"][c]
        print(f"{name:<40}{lat['p50']:>10.3f}{lat['p99']:>10.3f}{lat['n']:>8}")
    print(f"{'ratio polled/quiet':<40}{r['ratio_poll_p50']:>10.2f}{r['ratio_poll_p99']:>10.2f}")
    print(f"{'ratio browser/quiet':<40}{r['ratio_browser_p50']:>10.2f}{r['ratio_browser_p99']:>10.2f}")
    print(f"GET /api/state p50 {r['api_state_p50_ms']:.2f} ms; recording a step's figures + metrics "
          f"(Fleet.observed): {r['recording_us_per_step']:.1f} us")


if __name__ == "__main__":
    main()
