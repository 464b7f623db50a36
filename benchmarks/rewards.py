"""Microseconds per `RewardFunction.compute` call, for B=1 (one session's step) and larger batches
(vectorised sims), for the pass-through function, the Reacher-v5 example (launch/config/rewards/reach.yaml,
4 terms) and a config with every kind of term (8).

    python benchmarks/rewards.py [--batches 1 64 1024 4096 --repeat 7 --json PATH]

Prints a table and writes JSON (default benchmarks/results/rewards.json). Each figure is the median,
over `--repeat` runs of about 0.1 s, of the mean time per call: wall-clock, and the thread's CPU time
(which leaves out the time other processes held the core: the figure to read on a shared machine).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from bench import parser

from bridge.common.files import write_json
from bridge.rewards import RewardFunction
from protos.codec import Spec

OBS = (Spec("observation", np.float32, (11,)), Spec("joint_position", np.float32, (6,)))
ACT = (Spec("action", np.float32, (6,)),)
REACH = Path(__file__).resolve().parents[1] / "launch" / "config" / "rewards" / "reach.yaml"
FULL = {"reward": {"terms": [
    {"type": "env_reward"},
    {"type": "alive_bonus", "weight": 1.0},
    {"type": "goal_distance", "observation": "observation", "indices": [0, 1, 2], "goal": [0.5, 0.0, 0.2],
     "weight": -1.0},
    {"type": "action_magnitude", "action": "action", "weight": -0.01},
    {"type": "action_smoothness", "action": "action", "weight": -0.01},
    {"type": "joint_limit_proximity", "observation": "joint_position", "low": [-3.0] * 6, "high": [3.0] * 6,
     "margin": 0.1, "weight": -1.0},
    {"type": "success", "observation": "observation", "indices": [0, 1, 2], "goal": [0.5, 0.0, 0.2],
     "below": 0.05, "bonus": 10.0, "terminate": True},
    {"type": "failure", "observation": "observation", "indices": [4], "above": 0.8, "terminate": True},
]}}


def batch(specs: tuple[Spec, ...], b: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {s.name: rng.standard_normal((b, *s.shape)).astype(s.dtype) for s in specs}


def time_call(fn: RewardFunction, b: int, repeat: int, obs: tuple[Spec, ...] = OBS,
              act: tuple[Spec, ...] = ACT) -> tuple[float, float]:
    """(wall, cpu) microseconds per call, medians over `repeat` runs."""
    rng = np.random.default_rng(0)
    args = (batch(obs, b, rng), batch(act, b, rng), batch(obs, b, rng), rng.standard_normal(b))
    prev = batch(act, b, rng)
    fn.compute(*args, prev)
    n = 1
    while True:  # calibrate: calls per ~0.1 s run
        t0 = time.perf_counter()
        for _ in range(n):
            fn.compute(*args, prev)
        if time.perf_counter() - t0 > 0.05 or n >= 1 << 20:
            break
        n *= 2
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(n * 2):
            fn.compute(*args, prev)
        cpu.append((time.thread_time() - c0) / (n * 2) * 1e6)
        wall.append((time.perf_counter() - t0) / (n * 2) * 1e6)
    return float(np.median(wall)), float(np.median(cpu))


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 64, 1024, 4096])
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    reach_specs = ((Spec("observation", np.float32, (10,)),), (Spec("action", np.float32, (2,)),))
    functions = {"passthrough": (RewardFunction.passthrough(), OBS, ACT),
                 "reach": (RewardFunction.from_yaml(REACH), *reach_specs),
                 "all_terms": (RewardFunction.from_dict(FULL), OBS, ACT)}
    for fn, obs, act in functions.values():
        fn.check_specs(obs, act)
    rows = []
    print(f"{'config':<12} {'terms':>5} {'B':>6} {'wall us':>9} {'cpu us':>8} {'cpu ns/row':>10}")
    for name, (fn, obs, act) in functions.items():
        for b in args.batches:
            wall, cpu = time_call(fn, b, args.repeat, obs, act)
            rows.append({"config": name, "terms": len(fn.terms), "batch": b, "wall_us_per_call": wall,
                         "cpu_us_per_call": cpu, "cpu_ns_per_row": cpu * 1e3 / b})
            print(f"{name:<12} {len(fn.terms):>5} {b:>6} {wall:>9.1f} {cpu:>8.1f} {cpu * 1e3 / b:>10.1f}")
    write_json(args.json, {"python": sys.version.split()[0], "numpy": np.__version__, "machine": platform.machine(),
                           "load_average": list(os.getloadavg()), "results": rows})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
