"""Policy networks the trainer trains and `inference_server` serves (as TorchScript).

    >>> import numpy as np, torch
    >>> from protos.codec import Spec
    >>> obs = Spec("observation", np.float32, (11,))
    >>> act = Spec("action", np.float32, (3,), low=(-1.0,), high=(1.0,))
    >>> policy = MLPPolicy(obs, act, seed=0)
    >>> a = policy(torch.zeros(4, 11))
    >>> tuple(a.shape), bool((a.abs() <= 1).all())
    ((4, 3), True)
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from protos.codec import Spec


def _bounds(spec: Spec) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per-element (low, high) for a bounded spec; None when unbounded or partly unbounded."""
    if not spec.low or not spec.high:
        return None
    size = int(np.prod(spec.shape))
    low = np.broadcast_to(np.asarray(spec.low, np.float32), (size,)) if len(spec.low) in (1, size) else None
    high = np.broadcast_to(np.asarray(spec.high, np.float32), (size,)) if len(spec.high) in (1, size) else None
    if low is None or high is None:
        raise ValueError(f"{spec.name}: bounds must have 1 or {size} values")
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        return None
    return torch.from_numpy(low.copy()), torch.from_numpy(high.copy())


class MLPPolicy(nn.Module):
    """A deterministic MLP from one float observation vector to one action vector, squashed into
    the action bounds when the spec has them."""

    def __init__(self, observation: Spec, action: Spec, *, hidden: tuple[int, ...] = (64, 64),
                 seed: int | None = None):
        super().__init__()
        if len(observation.shape) != 1 or len(action.shape) != 1:
            raise ValueError(f"MLPPolicy takes vectors, got {observation.name}{list(observation.shape)} "
                             f"-> {action.name}{list(action.shape)}")
        if seed is not None:
            torch.manual_seed(seed)
        sizes = (observation.shape[0], *hidden)
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.Tanh()]
        layers.append(nn.Linear(sizes[-1], action.shape[0]))
        self.net = nn.Sequential(*layers)
        bounds = _bounds(action)
        self.squash = bounds is not None
        low, high = bounds if bounds is not None else (torch.zeros(action.shape), torch.zeros(action.shape))
        self.register_buffer("center", (high + low) / 2)
        self.register_buffer("half_range", (high - low) / 2)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        out = self.net(observation)
        if self.squash:
            out = self.center + self.half_range * torch.tanh(out)
        return out
