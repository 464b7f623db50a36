"""Small hand-made policies saved as TorchScript files with their specs (tether.json), for `tether eval` tests.

    path = linear_policy(tmp_path / "good.pt", "PointMass")                # a stabilising controller
    worse = linear_policy(tmp_path / "worse.pt", "PointMass", scale=0.86)  # ~11% lower return, every seed
    flipped = linear_policy(tmp_path / "flipped.pt", "PointMass", scale=-1.0)

action = tanh(scale * observation @ GAINS[env]) * high: for PointMass ([x, v], force in [-1, 1]) and
InvertedPendulum-v5 ([x, angle, x', angle'], force in [-3, 3]).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from inference_server.artifact import specs_to_json
from protos.codec import Spec

GAINS = {"PointMass": ((-2.0,), (-2.0,)), "InvertedPendulum-v5": ((1.0,), (10.0,), (1.0,), (1.0,))}
HIGH = {"PointMass": 1.0, "InvertedPendulum-v5": 3.0}


class Linear(torch.nn.Module):
    def __init__(self, gains, scale: float, high: float):
        super().__init__()
        self.register_buffer("gains", torch.tensor(gains, dtype=torch.float32) * scale)
        self.high = high

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.tanh(observation @ self.gains) * self.high


def linear_policy(path: Path, env: str, *, scale: float = 1.0, high: float | None = None) -> Path:
    """Save the controller for `env` (see the module docstring) at `path`; `high` overrides the output scale
    (beyond the env's bounds: actions the env clips, the eval counts as bound violations)."""
    gains = GAINS[env]
    bound = HIGH[env]
    obs = (Spec("observation", np.float32, (len(gains),)),)
    act = (Spec("action", np.float32, (1,), low=(-bound,), high=(bound,)),)
    module = torch.jit.script(Linear(gains, scale, bound if high is None else high).eval())
    torch.jit.save(module, str(path), _extra_files={"tether.json": specs_to_json(obs, act)})
    return path
