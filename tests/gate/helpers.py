"""Policies for InvertedPendulum-v5 with known behaviour, and publish headers built from them."""

from __future__ import annotations

import numpy as np
import torch

from protos import policies_pb2
from protos.codec import Spec, encode

OBS = (Spec("observation", np.float32, (4,)),)
ACT = (Spec("action", np.float32, (1,), low=(-3.0,), high=(3.0,)),)
STABLE = (1.0, 10.0, 1.0, 1.0)  # u = k . [x, theta, x_dot, theta_dot] keeps the pole up (return = episode length)


class Linear(torch.nn.Module):
    """action = clamp(k . observation, -limit, limit): a hand-written linear controller."""

    def __init__(self, gains=STABLE, *, limit: float = 3.0):
        super().__init__()
        self.k = torch.nn.Parameter(torch.tensor([gains], dtype=torch.float32), requires_grad=False)
        self.limit = limit

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.clamp(observation @ self.k.T, -self.limit, self.limit)


def probe_header(policy: str, reference: torch.nn.Module, *, seed: int = 0) -> policies_pb2.PublishHeader:
    """A publish header whose probe outputs are `reference`'s (the trainer's) on a random batch."""
    probe = np.random.default_rng(seed).normal(0, 0.2, (8, 4)).astype(np.float32)
    with torch.no_grad():
        outputs = reference(torch.from_numpy(probe)).numpy()
    return policies_pb2.PublishHeader(policy=policy, format="safetensors", probe_inputs=[encode("observation", probe)],
                                      probe_outputs=[encode("action", outputs)])
