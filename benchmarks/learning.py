"""The learning loop end to end (`tether demo --train`: Triton + gateway + MuJoCo/Newton sims + a trainer, all on
this machine), in four parts, each a learning curve with the moments new versions went live marked:

- pendulum: time and env steps to a return of 500 on InvertedPendulum-v5 from one vectorised session of 8 envs,
  PPO on 2 ranks, the median of `--runs` runs (target <= 20 s);
- sac: SAC's env steps to 500 on InvertedPendulum-v5 from the same session of 8 envs (`tether train --algo sac`,
  one rank) against PPO's;
- sac_paced: the same, but the sims at a robot's fixed control rate (`tether demo --rate`): one session of
  `--sac-paced-envs` envs at `--sac-rate` Hz (4 x 25 Hz = 100 env steps/s, near what the SAC learner updates
  per second on this machine), so SAC runs near its intended update-to-data ratio of 1; SAC's env steps and
  seconds to 500 and its update-to-data ratio, beside PPO's env steps from the pendulum part;
- cartpole: newton:cartpole, one vectorised session of 64 worlds, the return after `--cartpole-seconds`;
- hopper: Hopper-v5, one vectorised session of `--hopper-envs` envs, the return after `--hopper-seconds`
  (target >= 1000 after 600 s);
and publish -> served (the gateway's publish: written, loaded, checked, live) median and p99 over every version
published while training.

    python benchmarks/learning.py [--runs 5] [--hopper-seconds 600] [--only pendulum,sac,sac_paced,cartpole,hopper]
    python benchmarks/learning.py --only sac_paced --sac-rate 25 --sac-paced-envs 4 --sac-paced-seconds 330

Prints progress lines and a table; writes JSON (default benchmarks/results/learning.json; parts not run keep
their previous figures) and SVG curves beside it: learning_seconds.svg / learning_steps.svg (pendulum runs),
learning_sac.svg (SAC vs PPO against env steps), learning_sac_paced.svg (SAC at a fixed rate vs PPO),
learning_cartpole.svg, learning_hopper.svg.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench import parser, say
from svgplot import line_plot

from tether.topology import DemoConfig, run_demo, write_json

PARTS = ("pendulum", "sac", "sac_paced", "cartpole", "hopper")
PUBLISHED = re.compile(r"policy \S+ v(\d+) published by .*?\): (\w+), ([0-9.]+) s")
SAC_STATUS = re.compile(r"sac step (\d+) rows (\d+) .*? utd ([0-9.]+)")


def version_marks(curve: list[dict], x_key: str, *, labels: int = 12) -> list[tuple[float, str]]:
    """(x, "vN") where each version first acted: a new version went live (at most `labels` labelled)."""
    marks, seen = [], None
    for point in curve:
        if point["version"] is not None and point["version"] != seen:
            seen = point["version"]
            marks.append((point[x_key], f"v{seen}"))
    marks = marks[1:]  # v1 is there from the start
    every = max(1, -(-len(marks) // labels))
    return [(x, label if i % every == 0 else "") for i, (x, label) in enumerate(marks)]


def publish_seconds(run_dir: Path) -> list[float]:
    """Publish -> served (seconds) of each version that went live, from the gateway's log."""
    log = run_dir / "gateway.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return [float(m.group(3)) for m in PUBLISHED.finditer(text) if m.group(2) == "live"]


def one_run(label: str, config: DemoConfig) -> dict:
    say(f"{label}: {config.env}, {config.envs} envs, algo {getattr(config, 'algo', 'ppo')}, up to "
        f"{config.seconds:g} s, run dir {config.run_dir}")
    started = time.monotonic()
    summary = run_demo(config)
    trainer = config.run_dir / "trainer.json"
    curve = [c for c in summary["curve"] if c["return"] is not None]
    out = {"env": config.env, "envs": config.envs, "limit_s": config.seconds,
           "seconds_to_500": summary["seconds_to_500"], "steps_to_500": summary["steps_to_500"],
           "final_return": summary["recent_return"], "steps": summary["steps"], "steps_per_s": summary["steps_per_s"],
           "versions": len(summary["policy_versions"]), "errors": summary["errors"],
           "publish_served_s": publish_seconds(config.run_dir), "curve": curve,
           "trainer": json.loads(trainer.read_text()) if trainer.exists() else None,
           "wall_s": round(time.monotonic() - started, 1), "run_dir": str(config.run_dir)}
    say(f"{label}: 500 after {out['seconds_to_500']} s / {out['steps_to_500']} env steps; final return "
        f"{out['final_return']}; {out['steps_per_s']:.0f} env steps/s; {out['versions']} versions")
    return out


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def quantile(values: list[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


def plot(path: Path, series: dict[str, list[dict]], x_key: str, *, title: str, markers_from: list[dict]) -> None:
    data = {name: ([c[x_key] for c in curve], [c["return"] for c in curve]) for name, curve in series.items() if curve}
    if not data:
        return
    path.write_text(line_plot(data, title=title, x_label="wall time (s)" if x_key == "seconds" else "env steps",
                              y_label="mean return, last 20 episodes", markers=version_marks(markers_from, x_key)))


def config(a: argparse.Namespace, tmp: Path, name: str, **kw) -> DemoConfig:
    return DemoConfig(run_dir=tmp / name, train=True, **kw)


def pendulum(a, tmp, out_dir) -> dict:
    runs = [one_run(f"pendulum {i + 1}/{a.runs}",
                    config(a, tmp, f"pendulum{i}", env="InvertedPendulum-v5", envs=8, sessions=1,
                           seconds=a.pendulum_seconds, seed=i, stop_at_return=500.0))
            for i in range(a.runs)]
    for x_key in ("seconds", "steps"):
        plot(out_dir / f"learning_{x_key}.svg", {f"run {i + 1}": r["curve"] for i, r in enumerate(runs)}, x_key,
             title="InvertedPendulum-v5: PPO from 1 vectorised session x 8 envs", markers_from=runs[0]["curve"])
    reached = [r["seconds_to_500"] for r in runs]
    return {"runs": runs, "median_seconds_to_500": median(reached),
            "median_steps_to_500": median([r["steps_to_500"] for r in runs]),
            "reached": sum(s is not None for s in reached), "target_seconds": 20.0}


def sac(a, tmp, out_dir, ppo: dict | None) -> dict:
    if "algo" not in {f.name for f in dataclasses.fields(DemoConfig)}:
        return {"gap": "`tether demo --train --algo sac` does not exist in this tree"}
    try:
        run = one_run("sac", config(a, tmp, "sac", env="InvertedPendulum-v5", envs=a.sac_envs, sessions=1,
                                    seconds=a.sac_seconds, stop_at_return=500.0, algo="sac"))
    except Exception as exc:  # a part that fails is reported, the others still run
        return {"gap": f"SAC run failed: {type(exc).__name__}: {exc}"[:2000]}
    ppo_runs = (ppo or {}).get("runs") or []
    if ppo_runs:
        plot(out_dir / "learning_sac.svg", {"SAC": run["curve"], "PPO (pendulum run 1)": ppo_runs[0]["curve"]},
             "steps", title="InvertedPendulum-v5: SAC vs PPO, return against env steps", markers_from=run["curve"])
    ppo_steps = (ppo or {}).get("median_steps_to_500")
    return {"run": run, "steps_to_500": run["steps_to_500"], "ppo_median_steps_to_500": ppo_steps,
            "ppo_over_sac_steps": (ppo_steps / run["steps_to_500"]) if ppo_steps and run["steps_to_500"] else None}


def sac_updates(run_dir: Path) -> dict | None:
    """SAC's last status line in trainer.log: gradient updates, fresh rows (env steps) and their ratio."""
    log = run_dir / "trainer.log"
    found = SAC_STATUS.findall(log.read_text(errors="replace")) if log.exists() else []
    if not found:
        return None
    updates, rows, _ = found[-1]
    return {"updates": int(updates), "rows": int(rows), "utd": int(updates) / max(int(rows), 1)}


def sac_paced(a, tmp, out_dir, ppo: dict | None) -> dict:
    envs, rate = a.sac_paced_envs, a.sac_rate
    try:
        run = one_run("sac_paced", config(a, tmp, "sac_paced", env="InvertedPendulum-v5", envs=envs, sessions=1,
                                          seconds=a.sac_paced_seconds, stop_at_return=500.0, algo="sac",
                                          rate_hz=rate))
    except Exception as exc:  # a part that fails is reported, the others still run
        return {"gap": f"paced SAC run failed: {type(exc).__name__}: {exc}"[:2000]}
    ppo_runs = (ppo or {}).get("runs") or []
    series = {f"SAC, {envs} envs x {rate:g} Hz": run["curve"]}
    if ppo_runs:
        series["PPO (pendulum run 1, unpaced)"] = ppo_runs[0]["curve"]
    plot(out_dir / "learning_sac_paced.svg", series, "steps", markers_from=run["curve"],
         title=f"InvertedPendulum-v5: SAC at {envs} x {rate:g} Hz vs PPO, return against env steps")
    updates = sac_updates(Path(run["run_dir"]))
    best = max(run["curve"], key=lambda c: c["return"], default=None)
    ppo_steps = (ppo or {}).get("median_steps_to_500")
    return {"run": run, "envs": envs, "rate_hz": rate, "env_steps_per_s_target": envs * rate,
            "steps_to_500": run["steps_to_500"], "seconds_to_500": run["seconds_to_500"],
            "best_return": None if best is None else best["return"],
            "best_return_steps": None if best is None else best["steps"],
            "updates": updates, "utd": None if updates is None else updates["utd"],
            "ppo_median_steps_to_500": ppo_steps,
            "sac_over_ppo_steps": (run["steps_to_500"] / ppo_steps) if ppo_steps and run["steps_to_500"] else None}


def long_run(a, tmp, out_dir, name: str, env: str, envs: int, seconds: float, target: float | None) -> dict:
    run = one_run(name, config(a, tmp, name, env=env, envs=envs, sessions=1, seconds=seconds))
    plot(out_dir / f"learning_{name}.svg", {"mean return, last 20 episodes": run["curve"]}, "seconds",
         title=f"{env}: PPO from 1 vectorised session x {envs} envs", markers_from=run["curve"])
    best = max((c["return"] for c in run["curve"]), default=None)
    return {"run": run, "seconds": seconds, "final_return": run["final_return"], "best_return": best,
            "first_return": run["curve"][0]["return"] if run["curve"] else None, "target_return": target}


def table(result: dict) -> str:
    rows = [("part", "figure", "value", "target")]
    p = result.get("pendulum") or {}
    if p:
        rows += [("pendulum", f"median s to 500 ({p['reached']}/{len(p['runs'])} reached)",
                  str(p["median_seconds_to_500"]), "<= 20 s"),
                 ("pendulum", "median env steps to 500", str(p["median_steps_to_500"]), "")]
    s = result.get("sac") or {}
    if s:
        rows.append(("sac", "env steps to 500 (PPO median)",
                     s["gap"] if "gap" in s else f"{s['steps_to_500']} ({s['ppo_median_steps_to_500']})", "< PPO"))
    s = result.get("sac_paced") or {}
    if s:
        utd = "?" if s.get("utd") is None else f"{s['utd']:.2f}"
        rows.append(("sac_paced", f"env steps / s to 500 at {s.get('envs')} x {s.get('rate_hz')} Hz, utd (PPO)",
                     s["gap"] if "gap" in s else f"{s['steps_to_500']} / {s['seconds_to_500']} s, utd {utd} "
                     f"(best {s['best_return']} at {s['best_return_steps']}) ({s['ppo_median_steps_to_500']})",
                     "< PPO"))
    for part in ("cartpole", "hopper"):
        r = result.get(part) or {}
        if r:
            rows.append((part, f"return after {r['seconds']:g} s (first, best)",
                         f"{r['final_return']} ({r['first_return']}, {r['best_return']})",
                         f">= {r['target_return']:g}" if r["target_return"] else ""))
    ps = result.get("publish_served_s") or {}
    if ps:
        rows.append(("all", f"publish -> served median / p99 ({ps['versions']} versions)",
                     f"{ps['median']:.2f} / {ps['p99']:.2f} s", "<= 0.5 s median"))
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = parser(__file__, __doc__)
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {PARTS}")
    p.add_argument("--runs", type=int, default=5, help="pendulum runs (the median is reported)")
    p.add_argument("--pendulum-seconds", type=float, default=180.0, help="limit of each pendulum run")
    p.add_argument("--sac-envs", type=int, default=8, help="SAC: envs of its one vectorised session (as PPO's)")
    p.add_argument("--sac-seconds", type=float, default=240.0)
    p.add_argument("--sac-rate", type=float, default=25.0, help="sac_paced: the sims' control rate (Hz)")
    p.add_argument("--sac-paced-envs", type=int, default=4, help="sac_paced: envs of its one vectorised session")
    p.add_argument("--sac-paced-seconds", type=float, default=600.0, help="sac_paced: limit of the run")
    p.add_argument("--cartpole-seconds", type=float, default=120.0)
    p.add_argument("--hopper-envs", type=int, default=64)
    p.add_argument("--hopper-seconds", type=float, default=600.0)
    a = p.parse_args(argv)
    parts = [x.strip() for x in a.only.split(",") if x.strip()]
    if bad := [x for x in parts if x not in PARTS]:
        p.error(f"--only: unknown part(s) {bad}; choose from {PARTS}")
    previous = json.loads(a.json.read_text()) if a.json.exists() else {}
    result = {k: previous[k] for k in PARTS if k in previous and k not in parts and isinstance(previous[k], dict)}
    tmp = Path(tempfile.mkdtemp(prefix="tether-learning-"))
    load_before = os.getloadavg()
    say(f"parts {parts}; load average {load_before[0]:.1f}; runs under {tmp}")
    a.json.parent.mkdir(parents=True, exist_ok=True)
    if "pendulum" in parts:
        result["pendulum"] = pendulum(a, tmp, a.json.parent)
    if "sac" in parts:
        result["sac"] = sac(a, tmp, a.json.parent, result.get("pendulum"))
    if "sac_paced" in parts:
        result["sac_paced"] = sac_paced(a, tmp, a.json.parent, result.get("pendulum"))
    if "cartpole" in parts:
        result["cartpole"] = long_run(a, tmp, a.json.parent, "cartpole", "newton:cartpole", 64, a.cartpole_seconds,
                                      None)
    if "hopper" in parts:
        result["hopper"] = long_run(a, tmp, a.json.parent, "hopper", "Hopper-v5", a.hopper_envs, a.hopper_seconds,
                                    1000.0)
    served = [s for part in PARTS for run in _runs(result.get(part)) for s in run.get("publish_served_s", [])]
    if served:
        result["publish_served_s"] = {"versions": len(served), "median": median(served),
                                      "p99": quantile(served, 0.99), "max": max(served)}
    result.update({"machine": platform.machine(), "cpus": os.cpu_count(), "parts_run": parts,
                   "load_average_before": load_before, "load_average_after": os.getloadavg(),
                   "finished_unix": time.time()})
    write_json(a.json, result)
    print("\n" + table(result))
    print(f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}; JSON {a.json}")
    return 0


def _runs(part: dict | None) -> list[dict]:
    if not part:
        return []
    return part.get("runs") or ([part["run"]] if "run" in part else [])


if __name__ == "__main__":
    sys.exit(main())
