"""Episodes per minute through `tether eval` (Triton + gateway + the eval's vectorised sessions) against the same
episodes run in process (the same TorchScript file called directly in torch, no gateway), side by side in one
run: MuJoCo Hopper-v5 and NVIDIA Newton cartpole.

    python benchmarks/eval.py [--episodes 64 --envs 8 --rounds 2 --json PATH]

Both paths run the same waves (episode i on seed i, `--envs` envs stepped together, `tether.evaluation.episodes`
semantics), so their returns must agree: the table says whether they are bitwise equal. `tether eval` runs as
a subprocess, as CI runs it: "eval, episodes" is its episodes' own time (its JSON), "eval, end to end" the whole
command (start-up of Python, Triton and the gateway included). The paths alternate for `--rounds` rounds
and each reports its best round (the in-process path warms its TorchScript module up first). Writes JSON (default
benchmarks/results/eval.json). Each policy is a freshly initialised MLP (trainer.policy.MLPPolicy, seed 0) with its
output layer scaled by 0.05 (small actions: episodes of ~150 Hopper steps, ~80 cartpole steps).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from bench import machine, parser, report, specs

import sim
from inference_server.artifact import specs_to_json
from tether.evaluation.episodes import vector_id
from trainer.policy import MLPPolicy

ENVS = ("Hopper-v5", "newton:cartpole")


def policy_file(env_id: str, path: Path) -> Path:
    obs, act = specs(vector_id(env_id), num_envs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlp = MLPPolicy(obs[0], act[0], seed=0).eval()
        with torch.no_grad():  # small actions: a Hopper that stands ~150 steps, not one that falls in 13
            mlp.net[-1].weight.mul_(0.05)
            mlp.net[-1].bias.mul_(0.05)
        module = torch.jit.script(mlp)
        torch.jit.save(module, str(path), _extra_files={"tether.json": specs_to_json(obs, act)})
    return path


def in_process(env_id: str, path: Path, *, episodes: int, envs: int) -> dict:
    """The eval's waves with the policy called here: reset(seed=first of the wave), step until each counted
    env's first episode ended."""
    module = torch.jit.load(str(path)).eval()
    width = min(envs, episodes)
    env = sim.make(vector_id(env_id), num_envs=width, seed=0)
    name = env.observation_spec()[0].name
    with torch.inference_mode():  # the profiling executor's first calls
        for _ in range(3):
            module(torch.from_numpy(np.ascontiguousarray(env.reset(seed=0).observation[name])))
    returns: list[float] = []
    steps = 0
    start = time.perf_counter()
    try:
        for first in range(0, episodes, width):
            count = min(width, episodes - first)
            ts = env.reset(seed=first)
            done = np.arange(width) >= count
            totals = np.zeros(width)
            wave = [0.0] * count
            while not done.all():
                with torch.inference_mode():
                    action = module(torch.from_numpy(np.ascontiguousarray(ts.observation[name]))).numpy()
                ts = env.step({env.action_spec()[0].name: action})
                steps += int((~done).sum())
                totals += np.where(~done, ts.reward, 0.0)
                for j in np.flatnonzero(~done & ts.last()):
                    wave[j] = float(totals[j])
                    done[j] = True
            returns += wave
    finally:
        env.close()
    seconds = time.perf_counter() - start
    return {"returns": returns, "steps": steps, "seconds": seconds, "episodes_per_min": 60 * episodes / seconds}


def through_eval(env_id: str, path: Path, *, episodes: int, envs: int, folder: Path) -> dict:
    summary = folder / f"{env_id.replace(':', '_')}.json"
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "tether", "eval", str(path), "--env", env_id, "--episodes",
                          str(episodes), "--envs", str(envs), "--summary", str(summary)],
                         capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if run.returncode != 0:
        raise SystemExit(f"tether eval failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
    doc = json.loads(summary.read_text())
    c = doc["envs"][0]["candidate"]
    return {"returns": c["returns"], "steps": c["steps"], "seconds": c["seconds"],
            "episodes_per_min": c["episodes_per_min"], "end_to_end_s": wall,
            "end_to_end_episodes_per_min": 60 * episodes / wall, "latency_ms": c["latency_ms"],
            "versions": doc["versions"]}


def main() -> None:
    p = parser(__file__, __doc__, rounds=(2, "rounds of both paths, alternating"))
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--envs", type=int, default=8)
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-eval-") as tmp:
        folder = Path(tmp)
        for env_id in ENVS:
            path = policy_file(env_id, folder / f"{env_id.replace(':', '_')}.pt")
            locals_, remotes = [], []
            for _ in range(a.rounds):
                locals_.append(in_process(env_id, path, episodes=a.episodes, envs=a.envs))
                remotes.append(through_eval(env_id, path, episodes=a.episodes, envs=a.envs, folder=folder))
            local = max(locals_, key=lambda r: r["episodes_per_min"])
            remote = max(remotes, key=lambda r: r["episodes_per_min"])
            remote["end_to_end_episodes_per_min"] = max(r["end_to_end_episodes_per_min"] for r in remotes)
            identical = all(r["returns"] == remote["returns"] for r in remotes + locals_)
            if not identical:
                print(f"{env_id}: returns differ between rounds", file=sys.stderr)
            same = local["returns"] == remote["returns"]
            close = bool(np.allclose(local["returns"], remote["returns"], rtol=1e-5, atol=1e-6))
            rows.append({"env": env_id, "episodes": a.episodes, "envs": a.envs, "rounds": a.rounds,
                         "rounds_identical": identical, "in_process": local,
                         "tether_eval": remote, "returns_bitwise_equal": same, "returns_close": close,
                         "mean_episode_steps": local["steps"] / a.episodes})
    report(a.json, {"benchmark": "eval", "rows": rows, "machine": machine(cpus=os.cpu_count(), load=os.getloadavg())},
           print_table)


def print_table(result: dict) -> None:
    print(f"{'env':<17}{'ep. steps':>10}{'in process':>13}{'eval, episodes':>16}{'ratio':>7}"
          f"{'eval, end to end':>18}{'p50/p99 ms':>14}  returns equal")
    for r in result["rows"]:
        lp, ev = r["in_process"], r["tether_eval"]
        print(f"{r['env']:<17}{r['mean_episode_steps']:>10.0f}{lp['episodes_per_min']:>10.0f}/min"
              f"{ev['episodes_per_min']:>12.0f}/min{ev['episodes_per_min'] / lp['episodes_per_min']:>7.2f}"
              f"{ev['end_to_end_episodes_per_min']:>14.0f}/min"
              f"{ev['latency_ms']['p50']:>7.2f}/{ev['latency_ms']['p99']:<6.2f}"
              f"  {'bitwise' if r['returns_bitwise_equal'] else 'within 1e-5' if r['returns_close'] else 'NO'}")


if __name__ == "__main__":
    main()
