"""Behaviour cloning (SFT) from logged transitions: MSE of the policy's deterministic output.

The target is the action that reached the actuators (`applied_action`) when the log has it,
else the action the policy asked for. A `GaussianPolicy` fits its `action_mean`; an `MLPPolicy`
its `action`. Data-parallel (DDP) when a process group exists.

    >>> import numpy as np
    >>> from protos import codec, experience_pb2
    >>> from protos.codec import Spec
    >>> from trainer.policy import MLPPolicy
    >>> policy = MLPPolicy(Spec("observation", np.float32, (2,)), Spec("action", np.float32, (1,)), seed=0)
    >>> learner = BCLearner(policy, config=BCConfig(lr=1e-2))
    >>> batch = [experience_pb2.Transition(observation=[codec.encode("observation", np.ones(2, np.float32))],
    ...                                    action=[codec.encode("action", np.full(1, 0.5, np.float32))])]
    >>> first = learner.update(batch)["loss"]
    >>> for _ in range(50):
    ...     last = learner.update(batch)["loss"]
    >>> last < first, learner.steps
    (True, 51)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from protos import codec, experience_pb2
from trainer import dist
from trainer.policy import GaussianPolicy

__all__ = ["BCConfig", "BCLearner", "Deterministic", "targets"]


@dataclass(frozen=True)
class BCConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    bf16: bool = False

    def __post_init__(self):
        if not self.lr > 0 or self.weight_decay < 0 or not self.max_grad_norm > 0:
            raise ValueError(f"bad BC config: lr {self.lr} (> 0), weight_decay {self.weight_decay} (>= 0), "
                             f"max_grad_norm {self.max_grad_norm} (> 0)")


class Deterministic(nn.Module):
    """A policy's deterministic output: `action_mean` of a GaussianPolicy, else its only output."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if isinstance(self.policy, GaussianPolicy):
            return self.policy.mean(observation)
        return self.policy(observation)


def targets(transitions: Sequence[experience_pb2.Transition], *, observation: str = "observation",
            action: str = "action") -> tuple[np.ndarray, np.ndarray]:
    """(observations (B, d), target actions (B, a)) as float32; applied_action wins over action."""
    obs, act = [], []
    for t in transitions:
        obs.append(_named(t.observation, observation, t.offset))
        act.append(_named(t.applied_action if t.applied_action else t.action, action, t.offset))
    return np.stack(obs).astype(np.float32), np.stack(act).astype(np.float32)


def _named(tensors, name: str, offset: int) -> np.ndarray:
    for t in tensors:
        if t.name == name:
            return codec.decode(t).reshape(-1)
    raise codec.TensorError(name, f"missing from the transition at offset {offset} "
                                  f"(it has {[t.name for t in tensors]})")


class BCLearner:
    """One optimiser step per `update(batch)`; every rank must pass a batch of the same size."""

    def __init__(self, policy: nn.Module, *, config: BCConfig, observation: str = "observation",
                 action: str = "action"):
        self.config, self.observation, self.action = config, observation, action
        self.device = dist.device()
        self.policy = policy.to(self.device)
        if isinstance(policy, GaussianPolicy):
            policy.log_std.requires_grad_(False)  # BC fits the mean; the exploration noise stays as served
        self.model = Deterministic(self.policy)
        self.ddp: nn.Module = self.model
        if dist.is_distributed():
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(self.model)
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=config.lr,
                                           weight_decay=config.weight_decay)
        self.steps = 0

    def update(self, batch: Sequence[experience_pb2.Transition]) -> dict[str, float]:
        if not batch:
            raise ValueError("empty BC batch")
        obs, target = targets(batch, observation=self.observation, action=self.action)
        obs_t = torch.from_numpy(obs).to(self.device)
        target_t = torch.from_numpy(target).to(self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
            out = self.ddp(obs_t)
        if out.shape != target_t.shape:
            raise codec.TensorError(self.action, f"policy output shape {list(out.shape)} vs target "
                                                 f"{list(target_t.shape)}")
        loss = ((out.float() - target_t) ** 2).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.steps += 1
        return {"loss": float(loss.detach()), "samples": float(len(batch))}
