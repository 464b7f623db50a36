"""The learning loop as `tether demo --train` runs it (tether.topology.run_demo), for the tests that must see it
learn: ENVS envs of ENV in one vectorised session, trained until the mean return of the last 20 episodes reaches
TARGET, within LIMIT_S.

    summary, curve = learn(tmp_path, algo="sac")
    assert summary["seconds_to_500"] is not None, f"return stayed below {TARGET}:\n{curve}"
"""

from __future__ import annotations

import json
from pathlib import Path

from tether.topology import DemoConfig, run_demo

__all__ = ["ENV", "ENVS", "LIMIT_S", "TARGET", "learn"]

ENV, ENVS = "InvertedPendulum-v5", 8
TARGET = 500.0
LIMIT_S = 240.0


def learn(run_dir: Path, **config) -> tuple[dict, str]:
    """The run (`config`: more DemoConfig fields), stopped at TARGET: its summary, also written to
    run_dir/learning.json, and its learning curve, every tenth point a line, for a failure to show."""
    summary = run_demo(DemoConfig(env=ENV, envs=ENVS, sessions=1, seconds=LIMIT_S, run_dir=run_dir, train=True,
                                  stop_at_return=TARGET, **config))
    (run_dir / "learning.json").write_text(json.dumps(summary))
    curve = "\n".join(f"{p['seconds']:.0f}s {p['steps']} steps return {p['return']} v{p['version']}"
                      for p in summary["curve"][::10])
    return summary, curve
