"""Two chunked policies for the chunk-execution tests, and the env they drive (see test_chunk_alignment.py).

`Servo` is a two-joint robot that goes exactly where it is told (position = the action), observing its
position and its control tick. Both policies plan a ramp of H actions from the observed position at
VELOCITY per tick; each chunk also picks a "mode" from its tick (0 or MODE: a multimodal policy):

- `Inpaint` (real-time chunking) takes `action_prefix` and `action_delay` d: its first d actions are the
  prefix, and the rest continue the motion from the last committed action, steering toward its mode by
  MODE / H per tick, so its seam step is VELOCITY;
- `Planner` ignores them: its chunk starts from the observed position shifted by its mode, so a seam jumps
  by MODE (the jump LeRobot #4454 shows), which the client blends.

Every value is a multiple of 1/64, exact in float32, so the tests compare actions exactly.
"""

from __future__ import annotations

import numpy as np
import torch

from protos.codec import Spec
from sim.env import BaseEnvironment

__all__ = ["MODE", "VELOCITY", "Inpaint", "Planner", "Servo", "policy_specs"]

VELOCITY = (1 / 64, 1 / 32)        # per tick, each joint
MODE = 1 / 4                       # a chunk's mode offset: 0 or MODE


def policy_specs(horizon: int, *, prefix: bool) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    """(inputs, outputs) as the policy declares them: position (2,), tick (1,) [, action_prefix, action_delay]."""
    inputs = (Spec("position", np.float32, (2,)), Spec("tick", np.float32, (1,)))
    if prefix:
        inputs += (Spec("action_prefix", np.float32, (horizon, 2)), Spec("action_delay", np.int32, (1,)))
    return inputs, (Spec("target", np.float32, (horizon, 2)),)


class Servo(BaseEnvironment):
    """Observation {position (2,), tick (1,)}; action {target (2,)}: the next position. Never ends by itself
    (`max_steps`: truncated there)."""

    source = "test:Servo"

    def __init__(self, *, max_steps: int = 100_000):
        super().__init__(observation_spec=policy_specs(1, prefix=False)[0],
                         action_spec=(Spec("target", np.float32, (2,)),))
        self.max_steps, self.position, self.tick = max_steps, np.zeros(2, np.float32), 0
        self.applied: list[np.ndarray] = []

    def _observe(self) -> dict[str, np.ndarray]:
        return {"position": self.position.copy(), "tick": np.array([self.tick], np.float32)}

    def _reset(self, *, seed: int | None) -> dict[str, np.ndarray]:
        self.position, self.tick = np.zeros(2, np.float32), 0
        return self._observe()

    def _step(self, action: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, bool, bool]:
        self.position = np.asarray(action["target"], np.float32).copy()
        self.applied.append(self.position.copy())
        self.tick += 1
        return self._observe(), 0.0, False, self.tick >= self.max_steps


class _Ramp(torch.nn.Module):
    def __init__(self, horizon: int):
        super().__init__()
        self.horizon = horizon
        self.register_buffer("velocity", torch.tensor(VELOCITY, dtype=torch.float32).reshape(1, 1, 2))
        self.register_buffer("index", torch.arange(horizon, dtype=torch.float32).reshape(1, horizon, 1))

    def mode(self, tick: torch.Tensor) -> torch.Tensor:     # (B, 1) -> (B, 1, 1): 0 or MODE
        return (torch.remainder(torch.floor(tick / 3.0), 2.0) * MODE).reshape(-1, 1, 1)


class Planner(_Ramp):
    """The prefix-ignoring policy: position + mode + (i + 1) * VELOCITY for i = 0 .. H-1."""

    def forward(self, position: torch.Tensor, tick: torch.Tensor) -> torch.Tensor:
        return position.unsqueeze(1) + self.mode(tick) + (self.index + 1.0) * self.velocity


class Inpaint(_Ramp):
    """The prefix-inpainting policy: rows i < d are the prefix; row i >= d is anchor + (i - d + 1) * VELOCITY
    + mode * (i - d) / H, the anchor being the last committed action (the position when d = 0)."""

    def forward(self, position: torch.Tensor, tick: torch.Tensor, action_prefix: torch.Tensor,
                action_delay: torch.Tensor) -> torch.Tensor:
        d = action_delay.reshape(-1, 1, 1).to(torch.float32)
        last = torch.gather(action_prefix, 1, torch.clamp(d - 1.0, min=0.0).to(torch.int64).expand(-1, 1, 2))
        anchor = torch.where(d > 0.0, last, position.unsqueeze(1))
        after = self.index - d                                   # (B, H, 1): rows past the prefix count from 0
        plan = anchor + (after + 1.0) * self.velocity + self.mode(tick) * torch.clamp(after, min=0.0) / self.horizon
        return torch.where(after < 0.0, action_prefix, plan)
