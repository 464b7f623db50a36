"""Control-step round trip through the gateway vs a raw tritonclient call to the same Triton model,
measured side by side in one run, plus aggregate steps/s with 1, 8 and 32 concurrent sessions.

    python benchmarks/loop_latency.py [--rounds 5 --per-round 300 --seconds 5 --json PATH]

Prints a table and writes JSON (default benchmarks/results/loop_latency.json). Everything is on
loopback: Triton and the gateway are subprocesses, the clients run here.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as triton_grpc
from svgplot import cdf, line_plot

from inference_server import ModelRepository, TritonServer
from protos import bridge_pb2, bridge_pb2_grpc
from protos.codec import Spec, encode
from tether.topology import gateway_process, write_json
from trainer.policy import MLPPolicy

OBS = (Spec("observation", np.float32, (11,)),)  # Hopper-v5 sized
ACT = (Spec("action", np.float32, (3,), low=(-1.0,), high=(1.0,)),)
MODEL = "bench_mlp"


def percentiles(samples_ns: list[int]) -> dict:
    ms = np.asarray(samples_ns) / 1e6
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "n": len(ms)}


def raw_round_trips(url: str, n: int) -> list[int]:
    client = triton_grpc.InferenceServerClient(url)
    obs = np.random.default_rng(0).standard_normal((1, 11)).astype(np.float32)
    inp = triton_grpc.InferInput("observation", [1, 11], "FP32")
    out = [triton_grpc.InferRequestedOutput("action")]
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        inp.set_data_from_numpy(obs)
        client.infer(MODEL, [inp], model_version="1", outputs=out).as_numpy("action")
        samples.append(time.perf_counter_ns() - t0)
    client.close()
    return samples


class Session:
    """One Bridge.Connect stream stepping a fixed observation."""

    def __init__(self, address: str, name: str):
        self.address, self.name, self.step = address, name, 0

    async def __aenter__(self):
        self.channel = grpc.aio.insecure_channel(self.address)
        self.call = bridge_pb2_grpc.BridgeStub(self.channel).Connect()
        spec = dict(observation_spec=[s.to_proto() for s in OBS], action_spec=[s.to_proto() for s in ACT])
        await self.call.write(bridge_pb2.ClientMessage(hello=bridge_pb2.Hello(session_id=self.name, **spec)))
        await self.call.read()
        self.tensors = [encode("observation", np.random.default_rng(1).standard_normal(11).astype(np.float32))]
        return self

    async def __aexit__(self, *exc):
        await self.call.done_writing()
        await self.channel.close()

    async def round_trip(self) -> int:
        t0 = time.perf_counter_ns()
        obs = bridge_pb2.Observation(step=self.step, t_sent_ns=time.time_ns(), step_type=bridge_pb2.MID,
                                     tensors=self.tensors)
        self.step += 1
        await self.call.write(bridge_pb2.ClientMessage(observation=obs))
        reply = await self.call.read()
        if reply.WhichOneof("kind") != "action":
            raise RuntimeError(f"step {obs.step}: {reply}")
        return time.perf_counter_ns() - t0


async def gateway_round_trips(address: str, n: int, name: str) -> list[int]:
    async with Session(address, name) as s:
        return [await s.round_trip() for _ in range(n)]


async def throughput(address: str, sessions: int, seconds: float) -> dict:
    async def run(i: int, stop_at: float) -> list[int]:
        async with Session(address, f"tp{sessions}-{i}") as s:
            samples = []
            while time.monotonic() < stop_at:
                samples.append(await s.round_trip())
            return samples

    stop_at = time.monotonic() + seconds
    t0 = time.monotonic()
    results = await asyncio.gather(*(run(i, stop_at) for i in range(sessions)))
    elapsed = time.monotonic() - t0
    steps = sum(len(r) for r in results)
    return {"sessions": sessions, "steps": steps, "steps_per_s": steps / elapsed,
            "rtt_ms": percentiles([x for r in results for x in r])}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="alternating raw/gateway blocks")
    p.add_argument("--per-round", type=int, default=300, help="round trips per block")
    p.add_argument("--seconds", type=float, default=5.0, help="per throughput level")
    p.add_argument("--sessions", default="1,8,32")
    p.add_argument("--max-inflight", type=int, default=1, help="the gateway's in-flight batches per policy")
    p.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "loop_latency.json")
    a = p.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="tether-bench-"))
    repo = ModelRepository(run_dir / "models")
    repo.write_version(MODEL, 1, MLPPolicy(OBS[0], ACT[0], seed=0), OBS, ACT)
    with TritonServer(repo.root, models=[MODEL], log_path=run_dir / "triton.log") as triton, \
            gateway_process(triton_url=triton.grpc_url, policy=MODEL, log_path=run_dir / "gateway.log",
                            extra_args=("--max-inflight", str(a.max_inflight))) as gw:
        raw_round_trips(triton.grpc_url, 100)  # warm-up both paths
        asyncio.run(gateway_round_trips(gw, 100, "warmup"))
        raw, via = [], []
        for r in range(a.rounds):
            raw += raw_round_trips(triton.grpc_url, a.per_round)
            via += asyncio.run(gateway_round_trips(gw, a.per_round, f"lat{r}"))
            print(f"  round {r + 1}/{a.rounds}: raw p50 {np.median(raw) / 1e6:.3f} ms, "
                  f"gateway p50 {np.median(via) / 1e6:.3f} ms", flush=True)
        levels = []
        for n in (int(x) for x in a.sessions.split(",")):
            levels.append(asyncio.run(throughput(gw, n, a.seconds)))
            print(f"  {n:>3} sessions: {levels[-1]['steps_per_s']:.0f} steps/s", flush=True)
        version = triton.version
    result = {
        "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        "triton_version": version,
        "latency_ms": {"raw_tritonclient": percentiles(raw), "gateway": percentiles(via)},
        "ratio_p50": float(np.median(via) / np.median(raw)),
        "ratio_p99": float(np.percentile(via, 99) / np.percentile(raw, 99)),
        "throughput": levels,
        "scaling_max_vs_1": levels[-1]["steps_per_s"] / levels[0]["steps_per_s"],
    }
    print_table(result)
    write_json(a.json, result)
    plot = a.json.with_suffix(".svg")
    plot.write_text(line_plot({"raw tritonclient": cdf(np.asarray(raw) / 1e6),
                               "through the gateway": cdf(np.asarray(via) / 1e6)},
                              title="Batch-1 control step round trip (CDF)", x_label="ms", y_label="fraction"))
    print(f"wrote {a.json} and {plot}")
    return result


def print_table(r: dict) -> None:
    lat = r["latency_ms"]
    print(f"\n{'path':<22}{'p50 ms':>10}{'p99 ms':>10}")
    for name in ("raw_tritonclient", "gateway"):
        print(f"{name:<22}{lat[name]['p50']:>10.3f}{lat[name]['p99']:>10.3f}")
    print(f"{'ratio gateway/raw':<22}{r['ratio_p50']:>10.2f}{r['ratio_p99']:>10.2f}\n")
    print(f"{'sessions':<10}{'steps/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    for lv in r["throughput"]:
        print(f"{lv['sessions']:<10}{lv['steps_per_s']:>10.0f}{lv['rtt_ms']['p50']:>10.3f}{lv['rtt_ms']['p99']:>10.3f}")
    print(f"scaling {r['throughput'][-1]['sessions']} vs 1 session: {r['scaling_max_vs_1']:.1f}x")


if __name__ == "__main__":
    main()
