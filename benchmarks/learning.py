"""The learning loop end to end: return against wall time and against env steps for
`tether demo --train` (Triton + gateway + MuJoCo sims + a 2-rank PPO trainer under torchrun),
with the moments new policy versions went live marked.

    python benchmarks/learning.py [--env InvertedPendulum-v5 --envs 8 --seconds 240 --json PATH]

Prints a table, writes JSON (default benchmarks/results/learning.json) and two SVG plots beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

from svgplot import line_plot

from tether.topology import DemoConfig, run_demo, write_json


def version_marks(curve: list[dict], x_key: str) -> list[tuple[float, str]]:
    marks, seen = [], None
    for point in curve:
        if point["version"] is not None and point["version"] != seen:
            seen = point["version"]
            marks.append((point[x_key], f"v{seen}"))
    return marks[1:]  # v1 is there from the start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="InvertedPendulum-v5")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--seconds", type=float, default=240.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "learning.json")
    a = p.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="tether-learning-"))
    summary = run_demo(DemoConfig(env=a.env, envs=a.envs, seconds=a.seconds, run_dir=run_dir, train=True,
                                  seed=a.seed))
    curve = [c for c in summary["curve"] if c["return"] is not None]
    trainer = run_dir / "trainer.json"
    result = {"env": a.env, "envs": a.envs, "seconds": a.seconds, "machine": platform.machine(),
              "cpus": os.cpu_count(), "seconds_to_500": summary["seconds_to_500"],
              "steps_to_500": summary["steps_to_500"], "final_return": summary["recent_return"],
              "steps": summary["steps"], "steps_per_s": summary["steps_per_s"],
              "policy_versions": summary["policy_versions"], "curve": curve,
              "trainer": json.loads(trainer.read_text()) if trainer.exists() else None,
              "run_dir": str(run_dir)}
    write_json(a.json, result)
    for x_key, x_label in (("seconds", "wall time (s)"), ("steps", "env steps")):
        svg = line_plot({"mean return, last 20 episodes": ([c[x_key] for c in curve], [c["return"] for c in curve])},
                        title=f"{a.env}: PPO through gateway + Triton, {a.envs} sims, 2 trainer ranks",
                        x_label=x_label, y_label="return", markers=version_marks(curve, x_key))
        a.json.with_name(f"learning_{x_key}.svg").write_text(svg)
    print(f"\nreturn >= 500 after {summary['seconds_to_500']} s / {summary['steps_to_500']} env steps; "
          f"final {summary['recent_return']}; JSON {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
