"""PPO with GAE on trajectory segments, data-parallel (DDP) when a process group exists.

The learner owns the critic (it never leaves the trainer) and updates the served policy's
weights in place. Stale data (acted by versions older than the trainer's newest) is either
dropped past `max_version_lag` (`stale="drop"`; the PPO ratio is taken against the behaviour
log-prob) or kept (`stale="importance"`: the clipped ratio is taken against the policy at the
start of the update, and each sample is weighted by the truncated importance weight
min(pi_start / mu_behaviour, rho_max), as in decoupled PPO).

    learner = PPOLearner(policy, config=PPOConfig(), seed=0)
    assembler = TrajectoryAssembler()
    while training:
        assembler.extend(source.poll(timeout=0.5))
        if assembler.ready >= batch:
            stats = learner.update(assembler.take(), newest_version=v, newest_publish_ns=t)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from protos import codec
from trainer import dist
from trainer.policy import GaussianPolicy
from trainer.trajectory import Segment, gae, lag_stats, policy_lag

__all__ = ["ActorCritic", "PPOConfig", "PPOLearner", "STALE_MODES", "stale_terms"]

STALE_MODES = ("drop", "importance")


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters. `minibatches` per epoch is the same on every rank."""

    gamma: float = 0.99
    lam: float = 0.95
    clip: float = 0.2
    epochs: int = 10
    minibatches: int = 8
    lr: float = 1e-3
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    target_kl: float = 0.0           # stop an update's epochs once the mean approx KL passes it (0 = never)
    max_grad_norm: float = 0.5
    stale: str = "importance"
    max_version_lag: int = 2
    rho_max: float = 1.0
    bf16: bool = False
    critic_hidden: tuple[int, ...] = (64, 64)
    normalize_obs: bool = False      # running observation mean/std inside the served policy (buffers)
    normalize_value: bool = False    # the critic learns normalised returns; its output layer keeps its
                                     # outputs when the statistics move (PopArt's rescaling)
    value_norm_decay: float = 0.9    # per update: weight of the old return statistics

    def __post_init__(self):
        if self.stale not in STALE_MODES:
            raise ValueError(f"stale {self.stale!r} must be one of {STALE_MODES}")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("clip", "lr", "max_grad_norm", "rho_max"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("epochs", "minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.value_norm_decay < 1.0:
            raise ValueError(f"value_norm_decay must be in [0, 1), got {self.value_norm_decay}")
        if self.max_version_lag < 0:
            raise ValueError(f"max_version_lag must be >= 0, got {self.max_version_lag}")


class ActorCritic(nn.Module):
    """The served policy and the trainer-only critic; forward gives what the PPO loss needs."""

    def __init__(self, policy: GaussianPolicy, observation_size: int, hidden: tuple[int, ...]):
        super().__init__()
        self.policy = policy
        sizes = (observation_size, *hidden)
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.Tanh()]
        layers.append(nn.Linear(sizes[-1], 1))
        self.critic = nn.Sequential(*layers)
        # the critic's output is (return - ret_mean) / ret_std (identity unless `normalize_value`)
        self.register_buffer("ret_mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("ret_std", torch.ones((), dtype=torch.float64))

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(log_prob (B,), entropy (B,), normalised value (B,)), all float32."""
        log_prob, entropy = self.policy.log_prob(observation, action)
        return log_prob, entropy, self.critic(self.policy.normalize(observation)).squeeze(-1).float()

    def value(self, observation: torch.Tensor) -> torch.Tensor:
        """The value in return units."""
        out = self.critic(self.policy.normalize(observation)).squeeze(-1).float()
        return out * self.ret_std.float() + self.ret_mean.float()

    def set_return_stats(self, mean: float, std: float) -> None:
        """New return statistics; the output layer is rescaled so that `value` is unchanged."""
        with torch.no_grad():
            head: nn.Linear = self.critic[-1]
            old_mean, old_std = float(self.ret_mean), float(self.ret_std)
            head.weight.mul_(old_std / std)
            head.bias.mul_(old_std).add_(old_mean - mean).div_(std)
            self.ret_mean.fill_(mean)
            self.ret_std.fill_(std)


@dataclass
class _Batch:
    obs: torch.Tensor
    act: torch.Tensor
    rewards: np.ndarray
    behaviour: torch.Tensor
    has_behaviour: np.ndarray
    bounds: list[tuple[int, int]]
    boot_obs: torch.Tensor
    boot_index: list[int]  # per segment: row in boot_obs, -1 when terminated


class PPOLearner:
    """One PPO update per call on this rank's segments; gradients are averaged across ranks."""

    def __init__(self, policy: GaussianPolicy, *, config: PPOConfig, observation: str = "observation",
                 action: str = "action", seed: int = 0):
        if not isinstance(policy, GaussianPolicy):
            raise TypeError(f"PPO needs a GaussianPolicy (stochastic, with log-probabilities), got "
                            f"{type(policy).__name__}")
        self.config, self.observation, self.action = config, observation, action
        self.rank, self.world_size = dist.world()
        self.device = dist.device()
        torch.manual_seed(seed)  # the critic's initial weights: identical on every rank
        obs_size = policy.net[0].in_features
        self.model = ActorCritic(policy, obs_size, config.critic_hidden).to(self.device)
        self.ddp: nn.Module = self.model
        if dist.is_distributed():
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(self.model)  # broadcasts rank 0's parameters
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=config.lr, eps=1e-5)
        self.generator = torch.Generator().manual_seed(seed * 1009 + self.rank)
        self.steps = 0
        self._return_moments: tuple[float, float] | None = None  # (E[R], E[R^2]) for normalize_value

    @property
    def policy(self) -> GaussianPolicy:
        return self.model.policy

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.config.bf16)

    def _collect(self, segments: Sequence[Segment]) -> _Batch:
        obs, act, rewards, behaviour, has = [], [], [], [], []
        bounds, boot, boot_index = [], [], []
        n = 0
        for seg in segments:
            for t in seg.transitions:
                obs.append(_one(t.observation, self.observation))
                act.append(_one(t.action, self.action))
                rewards.append(t.reward)
                behaviour.append(t.log_prob)
                has.append(t.has_log_prob)
            bounds.append((n, n + len(seg)))
            n += len(seg)
            if seg.terminated or seg.bootstrap_observation is None:
                boot_index.append(-1)
            else:
                boot_index.append(len(boot))
                boot.append(np.asarray(seg.bootstrap_observation[self.observation], np.float32))
        width = self.policy.net[0].in_features
        return _Batch(obs=as_tensor(obs, width).to(self.device),
                      act=as_tensor(act, self.policy.log_std.shape[0]).to(self.device),
                      rewards=np.asarray(rewards, np.float64),
                      behaviour=torch.tensor(behaviour, dtype=torch.float32, device=self.device),
                      has_behaviour=np.asarray(has, bool), bounds=bounds,
                      boot_obs=as_tensor(boot, width).to(self.device), boot_index=boot_index)

    def update(self, segments: Sequence[Segment], *, newest_version: int = 0,
               newest_publish_ns: int = 0) -> dict[str, float]:
        """One PPO update (epochs x minibatches optimiser steps, the same on every rank)."""
        cfg = self.config
        b = self._collect(segments)
        transitions = [t for seg in segments for t in seg.transitions]
        behind, seconds = policy_lag(transitions, newest_version=newest_version, newest_publish_ns=newest_publish_ns)
        lag = lag_stats(behind, seconds, max_version_lag=cfg.max_version_lag)
        if cfg.normalize_obs:  # the same statistics on every rank: moments summed over all of them
            obs = b.obs.double()
            width = obs.shape[1]
            sums = dist.all_reduce_sum(torch.cat([torch.tensor([float(len(obs))], dtype=torch.float64),
                                                  obs.sum(0).cpu(), (obs ** 2).sum(0).cpu()]))
            self.policy.update_normalizer(float(sums[0]), sums[1:1 + width].to(self.device),
                                          sums[1 + width:].to(self.device))
        with torch.no_grad(), self._autocast():
            values = self.model.value(b.obs).double().cpu().numpy()
            boot_values = self.model.value(b.boot_obs).double().cpu().numpy()
            start_logp = self.policy.log_prob(b.obs, b.act)[0].float()
        advantages = np.zeros(len(values))
        returns = np.zeros(len(values))
        for (lo, hi), bi in zip(b.bounds, b.boot_index, strict=True):
            bootstrap = boot_values[bi] if bi >= 0 else 0.0
            advantages[lo:hi], returns[lo:hi] = gae(b.rewards[lo:hi], values[lo:hi], bootstrap,
                                                    gamma=cfg.gamma, lam=cfg.lam)
        has = torch.from_numpy(b.has_behaviour).to(self.device)
        behaviour = torch.where(has, b.behaviour, start_logp)  # no log-prob logged: treat as on-policy
        keep, old_logp, weight = stale_terms(cfg, behind=torch.from_numpy(behind).to(self.device),
                                             start_logp=start_logp, behaviour_logp=behaviour)
        adv = torch.from_numpy(advantages).float().to(self.device)
        kept = keep.nonzero().squeeze(-1).cpu()
        if cfg.normalize_value:
            returns = (returns - self._return_stats(returns[kept.numpy()])[0]) / float(self.model.ret_std)
        ret = torch.from_numpy(returns).float().to(self.device)
        moments = dist.all_reduce_sum(torch.tensor([float(len(kept)), adv[kept].sum().item(),
                                                    (adv[kept] ** 2).sum().item()], dtype=torch.float64))
        total = int(moments[0].item())
        if total > 0:
            mean = moments[1].item() / total
            std = math.sqrt(max(moments[2].item() / total - mean * mean, 0.0)) + 1e-8
            adv = (adv - mean) / std
        sums = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "approx_kl": 0.0, "clip_frac": 0.0}
        counted = 0
        for epoch in range(cfg.epochs):
            if cfg.target_kl > 0 and epoch:  # never on local state: a rank without data must join this collective
                kl = dist.all_reduce_sum(torch.tensor([sums["approx_kl"], float(counted)], dtype=torch.float64))
                if kl[0].item() / max(kl[1].item(), 1.0) > cfg.target_kl:
                    break  # the same decision on every rank: the KL is summed over all of them
            perm = kept[torch.randperm(len(kept), generator=self.generator)]
            parts = list(torch.tensor_split(perm, cfg.minibatches))
            counts = dist.all_reduce_sum(torch.tensor([float(len(p)) for p in parts], dtype=torch.float64))
            for idx, global_count in zip(parts, counts.tolist(), strict=True):
                if global_count == 0:
                    continue  # the same on every rank: nobody steps
                idx = idx.to(self.device)
                with self._autocast():
                    logp, entropy, value = self.ddp(b.obs[idx], b.act[idx])
                ratio = torch.exp(logp - old_logp[idx])
                a = adv[idx]
                surrogate = torch.min(ratio * a, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * a) * weight[idx]
                value_loss = 0.5 * (value - ret[idx]) ** 2
                per_sample = -surrogate + cfg.value_coef * value_loss - cfg.entropy_coef * entropy
                # DDP averages over ranks: scale the local sum so that the average is the global mean
                loss = per_sample.sum() * (self.world_size / global_count)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                self.steps += 1
                with torch.no_grad():
                    log_ratio = logp - old_logp[idx]
                    sums["policy_loss"] += float(-surrogate.sum())
                    sums["value_loss"] += float(value_loss.sum())
                    sums["entropy"] += float(entropy.sum())
                    sums["approx_kl"] += float(((ratio - 1) - log_ratio).sum())
                    sums["clip_frac"] += float(((ratio - 1).abs() > cfg.clip).float().sum())
                    counted += len(idx)
        keys = sorted(sums)
        totals = dist.all_reduce_sum(torch.tensor([sums[k] for k in keys] + [float(counted)], dtype=torch.float64))
        stats = {k: float(v) / max(float(totals[-1]), 1.0) for k, v in zip(keys, totals[:-1].tolist(), strict=True)}
        stats.update(samples=float(len(values)), kept=float(len(kept)), global_kept=float(total),
                     log_std=float(self.policy.log_std.detach().mean()))
        stats.update(lag_versions_mean=lag.versions_mean, lag_versions_max=float(lag.versions_max),
                     lag_seconds_mean=lag.seconds_mean, lag_seconds_max=lag.seconds_max, stale=float(lag.stale))
        return stats


    def _return_stats(self, returns: np.ndarray) -> tuple[float, float]:
        """Moves the critic's return statistics towards this batch's (all ranks); returns (mean, std)."""
        m = dist.all_reduce_sum(torch.tensor([float(len(returns)), float(returns.sum()), float((returns ** 2).sum())],
                                             dtype=torch.float64)).tolist()
        if m[0] > 0:
            mean, mean_sq = m[1] / m[0], m[2] / m[0]
            if self._return_moments is not None:
                d = self.config.value_norm_decay
                mean, mean_sq = (d * self._return_moments[0] + (1 - d) * mean,
                                 d * self._return_moments[1] + (1 - d) * mean_sq)
            self._return_moments = (mean, mean_sq)
            self.model.set_return_stats(mean, max(math.sqrt(max(mean_sq - mean * mean, 0.0)), 1e-2))
        return float(self.model.ret_mean), float(self.model.ret_std)


def stale_terms(config: PPOConfig, *, behind: torch.Tensor, start_logp: torch.Tensor,
                behaviour_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(keep mask, log-prob the PPO ratio is taken against, per-sample weight) for a batch.

    drop: samples more than `max_version_lag` versions behind are masked out; the ratio is
    pi / mu_behaviour, weight 1. importance: all kept; the ratio is pi / pi_start, weighted by
    min(pi_start / mu_behaviour, rho_max) (truncated importance weights).
    """
    if config.stale == "drop":
        return behind <= config.max_version_lag, behaviour_logp, torch.ones_like(behaviour_logp)
    weight = torch.exp(start_logp - behaviour_logp).clamp(max=config.rho_max)
    return torch.ones_like(behind, dtype=torch.bool), start_logp, weight


def as_tensor(rows: list[np.ndarray], width: int) -> torch.Tensor:
    return torch.from_numpy(np.stack(rows).astype(np.float32)) if rows else torch.zeros(0, width)


def _one(tensors, name: str) -> np.ndarray:
    for t in tensors:
        if t.name == name:
            return codec.decode(t).reshape(-1)
    raise codec.TensorError(name, f"missing from a transition (it has {[t.name for t in tensors]})")
