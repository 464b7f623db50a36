"""Env steps/s of vectorised sessions through gateway + Triton vs the same vector env driven by the same
policy in-process (TorchScript, no network), side by side in one run: MuJoCo Hopper (gymnasium
SyncVectorEnv) and an NVIDIA Newton task, at N = 1, 16, 64, 256 envs per session.

    python benchmarks/throughput.py [--envs 1,16,64,256 --seconds 4 --rounds 2 --split 2 --json PATH]

Prints a table and writes JSON (default benchmarks/results/throughput.json) and an SVG plot of steps/s
against N beside it. Triton and the gateway are subprocesses on loopback; the sim client (one
vectorised session, `sim.client.run_vector_sessions`) and the in-process loop run here, one torch
thread each (two cores). Paths alternate per round and each reports its best round. With `--split M`
(N >= 16) the gateway path also runs the same N envs as M sessions of N/M: while one session's batch is
in flight, the other's envs step, which hides the round trip a single lockstep session pays.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import warnings
from pathlib import Path

import torch
from bench import machine, parser, report, specs
from svgplot import line_plot

from inference_server import ModelRepository, TritonServer
from sim.client import run_vector_sessions
from sim.registry import make_vector_env
from tether.topology import gateway_process
from trainer.policy import MLPPolicy

SIMS = {"hopper": ("mujoco:Hopper-v5", {}), "newton_cartpole": ("newton:cartpole", {})}


def make(sim: str, n: int, seed: int = 0):
    name, kw = SIMS[sim]
    return make_vector_env(name, num_envs=n, seed=seed, **kw)


def in_process(sim: str, n: int, module: torch.jit.ScriptModule, seconds: float) -> dict:
    """The same vector env and policy in one loop: observation -> TorchScript -> env.step."""
    env = make(sim, n)
    try:
        ts, steps = env.reset(), 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            with torch.no_grad():
                action = module(torch.from_numpy(ts.observation["observation"])).numpy()
            ts = env.step({"action": action})
            steps += n
        elapsed = time.perf_counter() - start
    finally:
        env.close()
    return {"steps": steps, "seconds": elapsed, "steps_per_s": steps / elapsed}


def through_gateway(sim: str, n: int, address: str, seconds: float, sessions: int = 1) -> dict:
    per = n // sessions
    stats = asyncio.run(run_vector_sessions(address, lambda i: make(sim, per, seed=i * per), sessions=sessions,
                                            seconds=seconds, policy=sim))
    return {"steps": stats.steps, "seconds": stats.elapsed_s, "steps_per_s": stats.steps / stats.elapsed_s,
            "rtt_ms": stats.rtt_ms(), "errors": dict(stats.errors)}  # a step past the deadline is counted


def main(argv: list[str] | None = None) -> dict:
    p = parser(__file__, __doc__, rounds=(2, "alternating in-process/gateway blocks"))
    p.add_argument("--envs", default="1,16,64,256", help="envs per session (N)")
    p.add_argument("--sims", default=",".join(SIMS))
    p.add_argument("--seconds", type=float, default=4.0, help="per path, per N, per round")
    p.add_argument("--split", type=int, default=2, help="also run N envs as this many sessions (0: no)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [int(x) for x in a.envs.split(",")]
    sims = a.sims.split(",")
    run_dir = Path(tempfile.mkdtemp(prefix="tether-bench-"))
    repo = ModelRepository(run_dir / "models")
    modules = {}
    for sim in sims:
        obs, act = specs(SIMS[sim][0], num_envs=1)
        repo.write_version(sim, 1, MLPPolicy(obs[0], act[0], seed=0), obs, act, max_batch_size=max(sizes),
                           max_queue_delay_us=0)  # the gateway batches; Triton should not wait
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            modules[sim] = torch.jit.load(str(repo.root / sim / "1" / "policy.pt"), map_location="cpu").eval()
    rows = []
    with TritonServer(repo.root, models=sims, log_path=run_dir / "triton.log") as triton, \
            gateway_process(triton_url=triton.grpc_url, policy=sims[0], log_path=run_dir / "gateway.log",
                            extra_args=("--max-batch", str(max(sizes)), "--deadline-ms", "1000")) as gw:
        for sim in sims:
            through_gateway(sim, 4, gw, 0.5)  # warm-up: Triton's model instance, the gateway's lanes
            for n in sizes:
                local, via, split = [], [], []
                for _ in range(a.rounds):
                    local.append(in_process(sim, n, modules[sim], a.seconds))
                    via.append(through_gateway(sim, n, gw, a.seconds))
                    if a.split > 1 and n >= 16:
                        split.append(through_gateway(sim, n, gw, a.seconds, sessions=a.split))
                best_local = max(local, key=lambda r: r["steps_per_s"])
                best_via = max(via, key=lambda r: r["steps_per_s"])
                row = {"sim": sim, "env": SIMS[sim][0], "num_envs": n,
                       "in_process_steps_per_s": best_local["steps_per_s"],
                       "gateway_steps_per_s": best_via["steps_per_s"],
                       "ratio": best_via["steps_per_s"] / best_local["steps_per_s"],
                       "gateway_rtt_ms": best_via["rtt_ms"],
                       "gateway_errors": sum(sum(r["errors"].values()) for r in via + split),
                       "split_sessions": a.split if split else None,
                       "split_steps_per_s": max(r["steps_per_s"] for r in split) if split else None,
                       "rounds": {"in_process": local, "gateway": via, "gateway_split": split}}
                if split:
                    row["split_ratio"] = row["split_steps_per_s"] / row["in_process_steps_per_s"]
                rows.append(row)
                print(f"  {sim:<16} N={n:<4} in-process {row['in_process_steps_per_s']:>9.0f}  "
                      f"gateway {row['gateway_steps_per_s']:>9.0f} steps/s  ({row['ratio']:.0%})"
                      + (f"  {a.split} sessions {row['split_steps_per_s']:>9.0f} ({row['split_ratio']:.0%})"
                         if split else ""), flush=True)
        version = triton.version
    result = report(a.json, {"machine": machine(cpus=os.cpu_count(), load_avg=os.getloadavg()),
                             "triton_version": version, "seconds": a.seconds, "rounds": a.rounds, "results": rows},
                    print_table)
    plot = a.json.with_suffix(".svg")
    series = {}
    for sim in sims:
        mine = [r for r in rows if r["sim"] == sim]
        xs = [r["num_envs"] for r in mine]
        series[f"{sim} in-process"] = (xs, [r["in_process_steps_per_s"] for r in mine])
        series[f"{sim} gateway"] = (xs, [r["gateway_steps_per_s"] for r in mine])
        split_rows = [r for r in mine if r["split_steps_per_s"]]
        if split_rows:
            series[f"{sim} gateway, {a.split} sessions"] = ([r["num_envs"] for r in split_rows],
                                                          [r["split_steps_per_s"] for r in split_rows])
    plot.write_text(line_plot(series, title="Env steps/s vs envs per session (one session)",
                              x_label="envs per session (N)", y_label="env steps/s"))
    print(f"wrote {plot}")
    return result


def print_table(r: dict) -> None:
    print(f"\n{'sim':<18}{'N':>5}{'in-process/s':>14}{'gateway/s':>12}{'ratio':>8}{'rtt p50 ms':>12}"
          f"{'split/s':>10}{'ratio':>8}")
    for row in r["results"]:
        split = (f"{row['split_steps_per_s']:>10.0f}{row['split_ratio']:>8.0%}" if row["split_steps_per_s"]
                 else f"{'-':>10}{'-':>8}")
        print(f"{row['sim']:<18}{row['num_envs']:>5}{row['in_process_steps_per_s']:>14.0f}"
              f"{row['gateway_steps_per_s']:>12.0f}{row['ratio']:>8.0%}{row['gateway_rtt_ms']['p50'] or 0:>12.3f}"
              + split)


if __name__ == "__main__":
    main()
