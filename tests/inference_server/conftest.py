"""Fixtures for the inference_server tests: a small MLP policy and its specs.

Test modules run under --import-mode=importlib and cannot import this file, so everything
they share is a fixture.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from protos.codec import Spec


class MLP(torch.nn.Module):
    """A small policy: obs[B, 3] -> action[B, 2], weights fixed by `seed`."""

    def __init__(self, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        with torch.no_grad():
            for p in self.net.parameters():
                p.copy_(torch.randn(p.shape, generator=generator) * 0.5)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


@pytest.fixture(scope="session")
def mlp() -> Callable[[int], MLP]:
    """mlp(seed) -> a fresh MLP policy."""
    return MLP


@pytest.fixture(scope="session")
def specs() -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    """(observation_spec, action_spec) of the MLP."""
    return (Spec("obs", np.float32, (3,)),), (Spec("action", np.float32, (2,)),)


@pytest.fixture(scope="session")
def reference() -> Callable[..., np.ndarray]:
    """reference(module, *arrays) -> the module's own output as numpy."""

    def run(module: torch.nn.Module, *arrays: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return module(*(torch.from_numpy(a) for a in arrays)).numpy()

    return run


@pytest.fixture
def obs_batch() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
