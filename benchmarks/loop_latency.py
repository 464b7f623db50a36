"""Control-step round trip through the gateway vs a raw tritonclient call to the same Triton model,
measured side by side in one run, plus aggregate steps/s with 1, 8 and 32 concurrent sessions.

    python benchmarks/loop_latency.py [--rounds 5 --per-round 300 --seconds 5 --json PATH]
    python benchmarks/loop_latency.py --vector-of-one --baseline /tmp/before --sessions ""

Prints a table and writes JSON (default benchmarks/results/loop_latency.json). Everything is on
loopback: Triton and the gateway are subprocesses, the clients run here. `--vector-of-one` adds a
block stepping a vectorised session of one env (`Hello.batched`, tensors [1, ...]) through the same
gateway: what a single-env session would cost as a vector session of one. `--baseline TREE` starts a
second gateway from another checkout of the repository (e.g. `git worktree add /tmp/before <commit>`,
same venv) on the same Triton, and alternates its blocks with this tree's: before/after in one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as triton_grpc
from bench import machine, parser, report
from svgplot import cdf, line_plot

from bridge.client import Credentials
from bridge.client import Session as ClientSession
from bridge.common.percentiles import p50_p99, percentile
from inference_server import ModelRepository, TritonServer
from protos import bridge_pb2
from protos.codec import Spec, encode
from tether.topology import gateway_process
from trainer.policy import MLPPolicy

OBS = (Spec("observation", np.float32, (11,)),)  # Hopper-v5 sized
ACT = (Spec("action", np.float32, (3,), low=(-1.0,), high=(1.0,)),)
MODEL = "bench_mlp"


def percentiles(samples_ns: list[int]) -> dict:
    """p50/p99 in ms, nearest rank (bridge.common.percentiles: the console's and `tether sim`'s definition)."""
    p50, p99 = p50_p99(samples_ns)
    return {"p50": p50 / 1e6, "p99": p99 / 1e6, "n": len(samples_ns)}


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
    """One Bridge.Connect stream stepping a fixed observation, through `bridge.client.Session` (what
    `tether sim` and the edge use, so the figures include the client's own bookkeeping); `credentials`
    (`bridge.client.Credentials`) for TLS (benchmarks/tls.py)."""

    def __init__(self, address: str, name: str, *, vector: bool = False, credentials: Credentials | None = None):
        self.address, self.name, self.step, self.vector, self.credentials = address, name, 0, vector, credentials

    async def __aenter__(self):
        spec = dict(observation_spec=[s.to_proto() for s in OBS], action_spec=[s.to_proto() for s in ACT])
        hello = bridge_pb2.Hello(session_id=self.name, batched=self.vector, num_envs=1 if self.vector else 0, **spec)
        self.session = await ClientSession(self.address, hello, credentials=self.credentials).__aenter__()
        row = np.random.default_rng(1).standard_normal(11).astype(np.float32)
        self.tensors = [encode("observation", row[None] if self.vector else row)]
        return self

    async def __aexit__(self, *exc):
        await self.session.__aexit__(*exc)

    async def round_trip(self) -> int:
        t0 = time.perf_counter_ns()
        obs = bridge_pb2.Observation(step=self.step, t_sent_ns=time.time_ns(), step_type=bridge_pb2.MID,
                                     tensors=self.tensors)
        if self.vector:
            obs.env_step_types.append(bridge_pb2.MID)
        self.step += 1
        reply = await self.session.step(obs)
        if reply.WhichOneof("kind") != "action":
            raise RuntimeError(f"step {obs.step}: {reply}")
        return time.perf_counter_ns() - t0


async def gateway_round_trips(address: str, n: int, name: str, *, vector: bool = False) -> list[int]:
    async with Session(address, name, vector=vector) as s:
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


@contextlib.contextmanager
def baseline_gateway(tree: Path | None, **kwargs):
    """A gateway started from another checkout (`tree`, same venv: its packages shadow the installed ones
    because `python -m tether` puts the working directory first), or None without one."""
    if tree is None:
        yield None
        return
    pythonpath = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tree)
    try:
        with contextlib.chdir(tree):
            started = gateway_process(**kwargs)
            address = started.__enter__()
    finally:
        if pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = pythonpath
    try:
        yield address
    finally:
        started.__exit__(None, None, None)


def main(argv: list[str] | None = None) -> dict:
    p = parser(__file__, __doc__, rounds=(5, "alternating raw/gateway blocks"),
               per_round=(300, "round trips per block"))
    p.add_argument("--seconds", type=float, default=5.0, help="per throughput level")
    p.add_argument("--sessions", default="1,8,32", help="throughput levels ('' = none)")
    p.add_argument("--max-inflight", type=int, default=1, help="the gateway's in-flight batches per policy")
    p.add_argument("--deadline-ms", type=float, default=100.0,
                   help="the gateways' inference deadline (raise it on a loaded machine: a missed step aborts)")
    p.add_argument("--vector-of-one", action="store_true",
                   help="also step a vectorised session of one env (batched, [1, ...] tensors) in each round")
    p.add_argument("--baseline", type=Path, default=None, metavar="TREE",
                   help="another checkout whose gateway is measured in alternation with this one")
    a = p.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="tether-bench-"))
    repo = ModelRepository(run_dir / "models")
    repo.write_version(MODEL, 1, MLPPolicy(OBS[0], ACT[0], seed=0), OBS, ACT)
    gateway_args = ("--max-inflight", str(a.max_inflight), "--deadline-ms", f"{a.deadline_ms:g}")
    load_before = os.getloadavg()
    with TritonServer(repo.root, models=[MODEL], log_path=run_dir / "triton.log") as triton, \
            gateway_process(triton_url=triton.grpc_url, policy=MODEL, log_path=run_dir / "gateway.log",
                            extra_args=gateway_args) as gw, \
            baseline_gateway(a.baseline, triton_url=triton.grpc_url, policy=MODEL,
                             log_path=run_dir / "gateway_baseline.log",
                             extra_args=gateway_args) as base:
        paths = {"raw_tritonclient": lambda n, r: raw_round_trips(triton.grpc_url, n),
                 "gateway": lambda n, r: asyncio.run(gateway_round_trips(gw, n, f"lat{r}"))}
        if a.vector_of_one:
            paths["gateway_vector_of_one"] = lambda n, r: asyncio.run(
                gateway_round_trips(gw, n, f"vec{r}", vector=True))
        if base is not None:
            paths["gateway_baseline"] = lambda n, r: asyncio.run(gateway_round_trips(base, n, f"base{r}"))
        for measure in paths.values():  # warm-up every path
            measure(100, "warmup")
        samples: dict[str, list[int]] = {name: [] for name in paths}
        medians: dict[str, list[float]] = {name: [] for name in paths}  # per block: robust to a noisy block
        for r in range(a.rounds):
            order = list(paths) if r % 2 == 0 else list(paths)[::-1]  # no path always right after another
            for name in order:
                block = paths[name](a.per_round, r)
                samples[name] += block
                medians[name].append(float(np.median(block)) / 1e6)
            print(f"  round {r + 1}/{a.rounds}: " + ", ".join(f"{name} p50 {medians[name][-1]:.3f} ms"
                                                         for name in paths), flush=True)
        levels = []
        for n in (int(x) for x in a.sessions.split(",") if x.strip()):
            levels.append(asyncio.run(throughput(gw, n, a.seconds)))
            print(f"  {n:>3} sessions: {levels[-1]['steps_per_s']:.0f} steps/s", flush=True)
        version = triton.version
    raw, via = samples["raw_tritonclient"], samples["gateway"]
    latency = {name: percentiles(values) for name, values in samples.items()}
    result = {
        "machine": machine(cpus=os.cpu_count(), load_average_before=[round(x, 2) for x in load_before],
                           load_average_after=[round(x, 2) for x in os.getloadavg()]),
        "triton_version": version,
        "latency_ms": latency,
        "block_p50_ms": medians,
        "overhead_p50_ms": {name: latency[name]["p50"] - latency["raw_tritonclient"]["p50"]
                            for name in samples if name != "raw_tritonclient"},
        "ratio_p50": float(np.median(via) / np.median(raw)),
        "ratio_p99": float(percentile(via, 99) / percentile(raw, 99)),
        "throughput": levels,
    }
    if a.vector_of_one:
        result["vector_of_one_vs_single_p50"] = latency["gateway_vector_of_one"]["p50"] / latency["gateway"]["p50"]
    if base is not None:  # paired per round too: the two blocks of a round saw the same load
        result["baseline_tree"] = str(a.baseline)
        result["after_vs_baseline_p50"] = latency["gateway"]["p50"] / latency["gateway_baseline"]["p50"]
        result["after_vs_baseline_paired_median"] = float(np.median(
            np.asarray(medians["gateway"]) / np.asarray(medians["gateway_baseline"])))
        result["overhead_paired_median_ms"] = {name: float(np.median(np.asarray(medians[name])
                                                                     - np.asarray(medians["raw_tritonclient"])))
                                               for name in samples if name != "raw_tritonclient"}
    if levels:
        result["scaling_max_vs_1"] = levels[-1]["steps_per_s"] / levels[0]["steps_per_s"]
    report(a.json, result, print_table)
    plot = a.json.with_suffix(".svg")
    plot.write_text(line_plot({name.replace("_", " "): cdf(np.asarray(values) / 1e6)
                               for name, values in samples.items()},
                              title="Batch-1 control step round trip (CDF)", x_label="ms", y_label="fraction"))
    print(f"wrote {plot}")
    return result


def print_table(r: dict) -> None:
    lat, over = r["latency_ms"], r["overhead_p50_ms"]
    print(f"\n{'path':<24}{'p50 ms':>10}{'p99 ms':>10}{'over raw p50':>14}")
    for name, figures in lat.items():
        extra = f"{over[name]:>14.3f}" if name in over else ""
        print(f"{name:<24}{figures['p50']:>10.3f}{figures['p99']:>10.3f}{extra}")
    print(f"{'ratio gateway/raw':<24}{r['ratio_p50']:>10.2f}{r['ratio_p99']:>10.2f}")
    for key in ("vector_of_one_vs_single_p50", "after_vs_baseline_p50", "after_vs_baseline_paired_median",
                "overhead_paired_median_ms"):
        if key in r:
            value = r[key]
            print(f"{key}: " + (", ".join(f"{k} {v:.3f}" for k, v in value.items()) if isinstance(value, dict)
                                else f"{value:.3f}"))
    m = r["machine"]
    print(f"load average before {m['load_average_before']}, after {m['load_average_after']} ({m['cpus']} cpus)\n")
    if r["throughput"]:
        print(f"{'sessions':<10}{'steps/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
        for lv in r["throughput"]:
            print(f"{lv['sessions']:<10}{lv['steps_per_s']:>10.0f}{lv['rtt_ms']['p50']:>10.3f}"
                  f"{lv['rtt_ms']['p99']:>10.3f}")
        print(f"scaling {r['throughput'][-1]['sessions']} vs 1 session: {r['scaling_max_vs_1']:.1f}x")


if __name__ == "__main__":
    main()
