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

Several observation tensors (images + state: `observation=("observation", "top", "front")`) reach the policy in
their own dtype and shape, positionally in that order. A chunk policy (output (H, A)) learns chunked targets: the
H actions applied from each step on in its episode, padded with the episode's last (`chunk_targets`):

    learner = BCLearner(camera_policy, config=BCConfig(), observation=("observation", "top", "front"),
                        chunks=chunk_targets(dataset.transitions, horizon=16))
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from protos import codec, experience_pb2
from trainer import dist
from trainer.policy import GaussianPolicy

__all__ = ["BCConfig", "BCLearner", "Deterministic", "chunk_targets", "inputs", "targets"]


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

    def forward(self, observation: torch.Tensor, *more: torch.Tensor) -> torch.Tensor:
        if isinstance(self.policy, GaussianPolicy):
            return self.policy.mean(observation)
        return self.policy(observation, *more)


def targets(transitions: Sequence[experience_pb2.Transition], *, observation: str = "observation",
            action: str = "action") -> tuple[np.ndarray, np.ndarray]:
    """(observations (B, d), target actions (B, a)) as float32; applied_action wins over action."""
    obs, act = [], []
    for t in transitions:
        obs.append(_named(t.observation, observation, t.offset))
        act.append(_named(t.applied_action if t.applied_action else t.action, action, t.offset))
    return np.stack(obs).astype(np.float32), np.stack(act).astype(np.float32)


def _named(tensors, name: str, offset: int, *, flat: bool = True) -> np.ndarray:
    for t in tensors:
        if t.name == name:
            array = codec.decode(t)
            return array.reshape(-1) if flat else array
    raise codec.TensorError(name, f"missing from the transition at offset {offset} "
                                  f"(it has {[t.name for t in tensors]})")


def inputs(transitions: Sequence[experience_pb2.Transition], names: Sequence[str]) -> list[np.ndarray]:
    """Each named observation tensor stacked over `transitions`, (B, ...) in its logged dtype and shape (images
    stay uint8 (B, H, W, 3)); float tensors as float32."""
    stacked = []
    for name in names:
        array = np.stack([_named(t.observation, name, t.offset, flat=False) for t in transitions])
        stacked.append(array.astype(np.float32) if array.dtype.kind == "f" else array)
    return stacked


def chunk_targets(transitions: Sequence[experience_pb2.Transition], *, horizon: int,
                  action: str = "action") -> dict[int, np.ndarray]:
    """{offset: (horizon, a) float32}: the actions applied from that transition's step on, in its session's episode,
    padded with the episode's last action (a chunk policy's BC targets, from logs of one action per step).

    >>> from protos import codec, experience_pb2
    >>> log = [experience_pb2.Transition(offset=i, session="s", episode=0, step=i,
    ...        observation=[codec.encode("observation", np.zeros(1, np.float32))],
    ...        applied_action=[codec.encode("action", np.full(1, float(i), np.float32))]) for i in range(3)]
    >>> chunk_targets(log, horizon=2)[1][:, 0].tolist(), chunk_targets(log, horizon=4)[2][:, 0].tolist()
    ([1.0, 2.0], [2.0, 2.0, 2.0, 2.0])
    """
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
    episodes: dict[tuple[str, int], list[experience_pb2.Transition]] = defaultdict(list)
    for t in transitions:
        episodes[(t.session, t.episode)].append(t)
    chunks = {}
    for steps in episodes.values():
        steps.sort(key=lambda t: t.step)
        actions = np.stack([_named(t.applied_action if t.applied_action else t.action, action, t.offset)
                            for t in steps]).astype(np.float32)
        padded = np.concatenate([actions, np.repeat(actions[-1:], horizon - 1, axis=0)])
        for i, t in enumerate(steps):
            chunks[t.offset] = padded[i:i + horizon]
    return chunks


class BCLearner:
    """One optimiser step per `update(batch)`; every rank must pass a batch of the same size."""

    def __init__(self, policy: nn.Module, *, config: BCConfig, observation: str | Sequence[str] = "observation",
                 action: str = "action", chunks: Mapping[int, np.ndarray] | None = None):
        self.config, self.observation, self.action, self.chunks = config, observation, action, chunks
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
        if isinstance(self.observation, str):
            obs, target = targets(batch, observation=self.observation, action=self.action)
            feed = [obs]
        else:
            feed, target = inputs(batch, self.observation), None
        if self.chunks is not None:
            missing = [t.offset for t in batch if t.offset not in self.chunks]
            if missing:
                raise ValueError(f"no chunk target for the transitions at offsets {missing[:5]}: build `chunks` "
                                 "(chunk_targets) from the transitions the batches come from")
            target = np.stack([self.chunks[t.offset] for t in batch])
        elif target is None:
            target = targets(batch, observation=self.observation[0], action=self.action)[1]
        target_t = torch.from_numpy(target).to(self.device)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
            out = self.ddp(*(torch.from_numpy(x).to(self.device) for x in feed))
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
