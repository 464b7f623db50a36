"""How long the JetStream experience stream stops acknowledging when its leader goes: SIGKILL (a crash:
the followers elect a new leader after their election timeout) vs SIGTERM (a clean shutdown hands
leadership over first), and the publisher's throughput to an R3 stream on this machine.

    python benchmarks/nats_failover.py [--trials 3 --hz 200 --json PATH]

Each trial starts three routed nats-server processes (tether.cluster.nats.NatsCluster), publishes
transitions of one 11-float observation through `JetStreamLog` at `--hz` from one session, stops the
stream's leader one way, and reports the longest time nothing became durable (`longest_stall_s`).
Prints a table and writes JSON (default benchmarks/results/nats_failover.json).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench import parser, report

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bridge.experience.jetstream_log import JetStreamLog  # noqa: E402
from protos import experience_pb2  # noqa: E402
from protos.codec import encode  # noqa: E402
from tether.cluster.nats import NatsCluster  # noqa: E402


def transition(step: int) -> experience_pb2.Transition:
    return experience_pb2.Transition(session="bench", step=step, policy="p",
                                     observation=[encode("observation", np.full(11, step, np.float32))],
                                     action=[encode("action", np.zeros(3, np.float32))])


async def throughput(url: str, count: int = 20_000) -> dict:
    async with JetStreamLog(url) as log:
        start = time.perf_counter()
        futures = []
        for i in range(count):
            futures.append(log.append(transition(i)))
            if i % 500 == 0:
                await asyncio.sleep(0)
        await asyncio.gather(*futures)
        seconds = time.perf_counter() - start
        return {"transitions": count, "seconds": seconds, "per_second": count / seconds,
                "bytes_per_transition": log.stats.bytes / count}


async def trial(cluster: NatsCluster, how: str, hz: float) -> dict:
    async with JetStreamLog(cluster.url) as log:
        step = 0
        for _ in range(50):
            log.append(transition(step))
            step += 1
        await log.wait_durable(10)
        info = await log._js.stream_info(log.stream)
        leader = cluster.index(info.cluster.leader)
        stop_at = time.monotonic() + 15.0
        stopped = None
        while time.monotonic() < stop_at:
            log.append(transition(step))
            step += 1
            if stopped is None and time.monotonic() > stop_at - 14.0:
                stopped = time.monotonic()
                if how == "SIGKILL":
                    cluster.kill(leader)
                else:
                    cluster._procs[leader].terminate()
            await asyncio.sleep(1 / hz)
        assert await log.wait_durable(30), log.stats
        stats = log.stats
        return {"how": how, "leader": cluster.name(leader), "longest_stall_s": stats.longest_stall_s,
                "retries": stats.retries, "max_pending": stats.max_pending, "transitions": stats.durable}


async def main_async(args) -> dict:
    results = {"trials": []}
    with tempfile.TemporaryDirectory(prefix="tether-nats-bench-") as tmp:
        with NatsCluster(Path(tmp) / "tp", servers=3) as cluster:
            results["throughput_r3"] = await throughput(cluster.url)
        for i in range(args.trials):
            for how in ("SIGKILL", "SIGTERM"):
                with NatsCluster(Path(tmp) / f"{how}-{i}", servers=3) as cluster:
                    results["trials"].append(await trial(cluster, how, args.hz))
    return results


def main() -> None:
    p = parser(__file__, __doc__)
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--hz", type=float, default=200.0, help="transitions per second published during a trial")
    args = p.parse_args()
    report(args.json, asyncio.run(main_async(args)), print_table)


def print_table(results: dict) -> None:
    tp = results["throughput_r3"]
    print(f"publish to R3: {tp['per_second']:.0f} transitions/s ({tp['bytes_per_transition']:.0f} B each)")
    print(f"{'leader stopped by':<18}{'stall s (each trial)':<34}{'max':>6}")
    for how in ("SIGKILL", "SIGTERM"):
        stalls = [t["longest_stall_s"] for t in results["trials"] if t["how"] == how]
        print(f"{how:<18}{', '.join(f'{s:.2f}' for s in stalls):<34}{max(stalls):>6.2f}")

if __name__ == "__main__":
    main()
