"""Experience log throughput (durable transitions/s and MB/s, small vectors and 224x224 rgb), and the
control-loop round trip through the gateway with logging on vs off, side by side in one run.

    python benchmarks/experience.py [--seconds 5 --fsync-interval-ms 5 --loop-rounds 5 --per-round 300 --json PATH]
    python benchmarks/experience.py --no-loop       # the log alone (no Triton, no gateway)

Prints a table and writes JSON (default benchmarks/results/experience.json). "Durable" means the
append's future resolved: the record was fsynced. The log writes under a temporary directory on the
same disk as the run (set TMPDIR to measure another disk).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
from bench import machine, parser, report

from bridge.common.percentiles import p50_p99, percentile
from bridge.experience import ExperienceLog, read_transitions
from protos import bridge_pb2, codec, experience_pb2

VECTOR = {"observation": ((11,), np.float32)}
RGB = {"observation": ((11,), np.float32), "image": ((224, 224, 3), np.uint8)}
KINDS = {  # name -> (observation tensors, transitions kept in flight)
    "vector": (VECTOR, 4096),     # throughput: many sessions' worth of appends outstanding
    "rgb224": (RGB, 256),
    "rgb1080": ({"image": ((1080, 1920, 3), np.uint8)}, 8),
    "vector-1": (VECTOR, 1),      # one append at a time: the ack latency is the group commit's
}


def make_transition(kind: str, rng: np.random.Generator) -> experience_pb2.Transition:
    obs = []
    for name, (shape, dtype) in KINDS[kind][0].items():
        a = rng.integers(0, 256, shape, dtype=np.uint8) if dtype == np.uint8 else rng.standard_normal(shape)
        obs.append(codec.encode(name, a.astype(dtype)))
    return experience_pb2.Transition(session="bench", episode=0, step_type=bridge_pb2.MID, observation=obs,
                                     action=[codec.encode("action", np.zeros(3, np.float32))], reward=1.0,
                                     policy="bench", policy_version=1, reward_version="r")


async def durable_rate(kind: str, seconds: float, *, fsync_interval_s: float, directory: Path) -> dict:
    """Appends `kind` transitions for `seconds`, keeping a bounded number in flight; measures acks."""
    template = make_transition(kind, np.random.default_rng(0))
    inflight = KINDS[kind][1]
    latencies: list[int] = []
    async with ExperienceLog(directory, fsync_interval_s=fsync_interval_s) as log:
        t0 = time.perf_counter()
        next_report, step = t0 + 1.0, 0
        while (now := time.perf_counter()) < t0 + seconds:
            while log.next_offset - log.durable_offset < inflight:
                t = experience_pb2.Transition()
                t.CopyFrom(template)
                t.step = step
                step += 1
                sent = time.perf_counter_ns()
                log.append(t).add_done_callback(lambda _f, s=sent: latencies.append(time.perf_counter_ns() - s))
            await log.wait_durable(log.durable_offset, timeout=1.0)
            if now >= next_report:
                s = log.stats
                print(f"  {kind:<9}{now - t0:5.1f}s  durable {s.durable:>8}  ({s.durable / (now - t0):,.0f}/s, "
                      f"{s.bytes / 1e6 / (now - t0):.1f} MB/s)  fsyncs {s.fsyncs}", flush=True)
                next_report += 1.0
        elapsed = time.perf_counter() - t0
        stats = log.stats
        durable, nbytes = stats.durable, stats.durable * (template.ByteSize() + 31)  # + the MCAP record header
    ms = np.asarray(latencies) / 1e6
    return {"kind": kind, "transition_bytes": template.ByteSize(), "seconds": elapsed, "durable": durable,
            "transitions_per_s": durable / elapsed, "mb_per_s": nbytes / 1e6 / elapsed, "fsyncs": stats.fsyncs,
            "mean_group": durable / max(stats.fsyncs, 1), "segments": stats.segments,
            "ack_ms": dict(zip(("p50", "p99"), map(float, p50_p99(ms.tolist())), strict=True))}  # nearest rank


async def stream_rate(directory: Path, *, window: int = 4096, max_batch: int = 256) -> dict:
    """Replays a whole log through tether.v1.Experience.Subscribe (real grpc.aio on loopback, acking
    each batch): what a trainer can consume."""
    import grpc

    from bridge.client import ExperienceClient
    from bridge.experience.service import ExperienceService
    from protos import experience_pb2_grpc

    async with ExperienceLog(directory) as log:
        server = grpc.aio.server()
        experience_pb2_grpc.add_ExperienceServicer_to_server(ExperienceService(log), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        total = log.durable_offset
        async with ExperienceClient(f"127.0.0.1:{port}", aio=True) as client:
            call = client.subscribe()
            t0 = time.perf_counter()
            await call.write(experience_pb2.SubscribeRequest(
                start=experience_pb2.SubscribeStart(window=window, max_batch=max_batch)))
            got = nbytes = 0
            while got < total:
                batch = await call.read()
                got += len(batch.transitions)
                nbytes += batch.ByteSize()
                await call.write(experience_pb2.SubscribeRequest(
                    ack=experience_pb2.SubscribeAck(through_offset=batch.next_offset)))
            elapsed = time.perf_counter() - t0
            call.cancel()
        await server.stop(None)
    return {"transitions": got, "seconds": elapsed, "transitions_per_s": got / elapsed,
            "mb_per_s": nbytes / 1e6 / elapsed}


def loop_overhead(rounds: int, per_round: int, *, fsync_interval_ms: float, run_dir: Path) -> dict:
    """Batch-1 round trips through two gateways in front of one Triton, one logging every transition
    and one not, in alternating blocks (so both see the same machine)."""
    from loop_latency import ACT, MODEL, OBS, Session, percentiles

    from inference_server import ModelRepository, TritonServer
    from tether.topology import gateway_process
    from trainer.policy import MLPPolicy

    repo = ModelRepository(run_dir / "models")
    repo.write_version(MODEL, 1, MLPPolicy(OBS[0], ACT[0], seed=0), OBS, ACT)
    logged = ("--experience-dir", str(run_dir / "experience"), "--fsync-interval-ms", str(fsync_interval_ms))
    with TritonServer(repo.root, models=[MODEL], log_path=run_dir / "triton.log") as triton, \
            gateway_process(triton_url=triton.grpc_url, policy=MODEL, log_path=run_dir / "gw-off.log") as off, \
            gateway_process(triton_url=triton.grpc_url, policy=MODEL, log_path=run_dir / "gw-on.log",
                            extra_args=logged) as on:
        errors = {"without_log": 0, "with_log": 0}

        async def block(address: str, n: int, name: str, key: str) -> list[int]:
            """n round trips; a step answered with an error (e.g. a deadline on a loaded machine) is counted."""
            samples = []
            async with Session(address, name) as s:
                for _ in range(n):
                    try:
                        samples.append(await s.round_trip())
                    except RuntimeError:
                        errors[key] += 1
            return samples

        asyncio.run(block(off, 100, "warm-off", "without_log"))
        asyncio.run(block(on, 100, "warm-on", "with_log"))
        errors.update(without_log=0, with_log=0)
        without, with_log = [], []
        for r in range(rounds):
            without += asyncio.run(block(off, per_round, f"off{r}", "without_log"))
            with_log += asyncio.run(block(on, per_round, f"on{r}", "with_log"))
            print(f"  round {r + 1}/{rounds}: p50 without log {np.median(without) / 1e6:.3f} ms, "
                  f"with log {np.median(with_log) / 1e6:.3f} ms", flush=True)
    return {"without_log": percentiles(without), "with_log": percentiles(with_log),
            "ratio_p50": float(np.median(with_log) / np.median(without)),
            "ratio_p99": float(percentile(with_log, 99) / percentile(without, 99)),
            "transitions_logged": sum(1 for _ in read_transitions(run_dir / "experience")), "step_errors": errors}


def main(argv: list[str] | None = None) -> dict:
    p = parser(__file__, __doc__, per_round=(300, "round trips per block"))
    p.add_argument("--seconds", type=float, default=5.0, help="per transition kind")
    p.add_argument("--fsync-interval-ms", type=float, default=5.0)
    p.add_argument("--no-loop", action="store_true", help="skip the gateway with/without log comparison")
    p.add_argument("--loop-rounds", type=int, default=5)
    a = p.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="tether-bench-exp-"))
    rates = [asyncio.run(durable_rate(kind, a.seconds, fsync_interval_s=a.fsync_interval_ms / 1e3,
                                      directory=run_dir / f"log-{kind}")) for kind in KINDS]
    result = {"machine": machine(), "fsync_interval_ms": a.fsync_interval_ms, "durable": rates, "stream": {}}
    for kind in ("vector", "rgb224"):
        result["stream"][kind] = asyncio.run(stream_rate(run_dir / f"log-{kind}"))
        print(f"  stream {kind}: {result['stream'][kind]['transitions_per_s']:,.0f} transitions/s", flush=True)
    if not a.no_loop:
        result["control_loop"] = loop_overhead(a.loop_rounds, a.per_round, fsync_interval_ms=a.fsync_interval_ms,
                                               run_dir=run_dir)
    return report(a.json, result, print_table)


def print_table(r: dict) -> None:
    print(f"\n{'kind':<10}{'bytes':>9}{'durable/s':>12}{'MB/s':>9}{'fsyncs':>8}{'group':>8}{'ack p50':>9}{'p99 ms':>9}")
    for x in r["durable"]:
        print(f"{x['kind']:<10}{x['transition_bytes']:>9}{x['transitions_per_s']:>12,.0f}{x['mb_per_s']:>9.1f}"
              f"{x['fsyncs']:>8}{x['mean_group']:>8.1f}{x['ack_ms']['p50']:>9.2f}{x['ack_ms']['p99']:>9.2f}")
    print(f"\n{'Subscribe replay':<18}{'transitions/s':>14}{'MB/s':>9}")
    for kind, x in r["stream"].items():
        print(f"{kind:<18}{x['transitions_per_s']:>14,.0f}{x['mb_per_s']:>9.1f}")
    if "control_loop" in r:
        c = r["control_loop"]
        print(f"\n{'gateway round trip':<22}{'p50 ms':>10}{'p99 ms':>10}")
        for name in ("without_log", "with_log"):
            print(f"{name:<22}{c[name]['p50']:>10.3f}{c[name]['p99']:>10.3f}")
        print(f"{'ratio with/without':<22}{c['ratio_p50']:>10.2f}{c['ratio_p99']:>10.2f}")


if __name__ == "__main__":
    main()
