"""Soft actor-critic on replayed transitions: twin Q critics with target copies, an automatically tuned
entropy temperature, and the served `GaussianPolicy` as the actor (its weights publish as the same model).

The actor is the distribution the sessions act with: Triton samples action = mean + exp(log_std) * noise
(mean squashed into the bounds, the sample not squashed) and the actuator clips it. SAC trains exactly
that unsquashed Gaussian: its log-probability has no tanh correction, and the critics learn Q over the
sampled (unclipped) action, the clip being part of the environment. With a state-independent
`log_std`, the temperature drives the policy's entropy to `target_entropy` (default -action size).

    learner = SACLearner(policy, config=SACConfig(), seed=0)
    while training:
        stats = learner.update(replay.sample(256, rng))   # one gradient step of critics, actor, temperature

    >>> import numpy as np
    >>> from protos.codec import Spec
    >>> from trainer.policy import GaussianPolicy
    >>> policy = GaussianPolicy(Spec("observation", np.float32, (3,)),
    ...                         Spec("action", np.float32, (1,), low=(-2.0,), high=(2.0,)), seed=0)
    >>> learner = SACLearner(policy, config=SACConfig(critic_hidden=(32, 32)), seed=0)
    >>> rng = np.random.default_rng(0)
    >>> batch = {"observation": rng.normal(size=(8, 3)), "action": rng.normal(size=(8, 1)), "reward": np.ones(8),
    ...          "next_observation": rng.normal(size=(8, 3)), "done": np.zeros(8)}
    >>> stats = learner.update(batch)
    >>> learner.steps, sorted(stats)
    (1, ['actor_loss', 'alpha', 'critic_loss', 'entropy', 'log_std', 'q'])
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainer import dist
from trainer.policy import GaussianPolicy

__all__ = ["SACConfig", "SACLearner", "TwinQ"]

_LOG_SQRT_2PI = 0.9189385332046727


@dataclass(frozen=True)
class SACConfig:
    """SAC hyperparameters (`target_entropy` None: -action size)."""

    gamma: float = 0.99
    tau: float = 0.02                # Polyak averaging of the target critics per update
    actor_lr: float = 3e-3
    critic_lr: float = 3e-3
    alpha_lr: float = 3e-3
    init_alpha: float = 0.1
    target_entropy: float | None = None
    critic_hidden: tuple[int, ...] = (64, 64)
    layer_norm: bool = True          # LayerNorm in the critics (RLPD: keeps Q bounded on offline data)
    max_grad_norm: float = 10.0

    def __post_init__(self):
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        for name in ("actor_lr", "critic_lr", "alpha_lr", "init_alpha", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.critic_hidden or min(self.critic_hidden) < 1:
            raise ValueError(f"critic_hidden must be positive sizes, got {self.critic_hidden}")


class TwinQ(nn.Module):
    """Two Q(s, a) MLPs evaluated as one batched ensemble (one bmm per layer): forward -> (2, B)."""

    def __init__(self, observation_size: int, action_size: int, hidden: tuple[int, ...], *,
                 layer_norm: bool = True, members: int = 2):
        super().__init__()
        sizes = (observation_size + action_size, *hidden, 1)
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            w = torch.empty(members, a, b)
            for m in range(members):  # nn.Linear's initialisation, per member
                nn.init.kaiming_uniform_(w[m].T, a=math.sqrt(5))
            self.weights.append(nn.Parameter(w))
            self.biases.append(nn.Parameter(torch.empty(members, 1, b).uniform_(-1 / math.sqrt(a), 1 / math.sqrt(a))))
        self.layer_norm = layer_norm
        self.members = members

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([observation, action], dim=-1).unsqueeze(0).expand(self.members, -1, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                if self.layer_norm:
                    x = F.layer_norm(x, x.shape[-1:])
                x = F.relu(x)
        return x.squeeze(-1)


class _SAC(nn.Module):
    """Everything a checkpoint holds: the actor, the critics, their targets and the temperature."""

    def __init__(self, policy: GaussianPolicy, critic: TwinQ, init_alpha: float):
        super().__init__()
        self.policy = policy
        self.critic = critic
        self.target = copy.deepcopy(critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha)))


class _Optimizers:
    """The three Adam optimisers as one `state_dict` (what `trainer.checkpoint` saves)."""

    def __init__(self, **optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    def state_dict(self) -> dict:
        return {name: opt.state_dict() for name, opt in self.optimizers.items()}

    def load_state_dict(self, state: dict) -> None:
        for name, opt in self.optimizers.items():
            opt.load_state_dict(state[name])


class SACLearner:
    """One SAC gradient step per `update(batch)`; `policy` is updated in place. Single process."""

    def __init__(self, policy: GaussianPolicy, *, config: SACConfig = SACConfig(), seed: int = 0):
        if not isinstance(policy, GaussianPolicy):
            raise TypeError(f"SAC trains a GaussianPolicy (a stochastic actor), got {type(policy).__name__}")
        self.config = config
        self.device = dist.device()
        torch.manual_seed(seed)
        self.obs_size = policy.net[0].in_features
        self.act_size = policy.log_std.shape[0]
        critic = TwinQ(self.obs_size, self.act_size, config.critic_hidden, layer_norm=config.layer_norm)
        self.model = _SAC(policy, critic, config.init_alpha).to(self.device)
        self.policy: GaussianPolicy = self.model.policy
        self.target_entropy = (-float(self.act_size) if config.target_entropy is None
                               else float(config.target_entropy))
        self.optimizer = _Optimizers(
            actor=torch.optim.Adam(self.policy.parameters(), lr=config.actor_lr),
            critic=torch.optim.Adam(self.model.critic.parameters(), lr=config.critic_lr),
            alpha=torch.optim.Adam([self.model.log_alpha], lr=config.alpha_lr))
        self.steps = 0

    def sample(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, log-probability (B,)): reparameterised draws of the served Gaussian (unsquashed)."""
        mean = self.policy.mean(observation)
        log_std = self.policy.log_std
        noise = torch.randn_like(mean)
        action = mean + torch.exp(log_std) * noise
        log_prob = (-0.5 * noise * noise - log_std - _LOG_SQRT_2PI).sum(dim=-1)
        return action, log_prob

    def critic_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The twin critics' mean squared soft Bellman error on `batch` (target critics, fixed temperature)."""
        cfg = self.config
        with torch.no_grad():
            next_action, next_logp = self.sample(batch["next_observation"])
            next_q = self.model.target(batch["next_observation"], next_action).min(dim=0).values
            alpha = self.model.log_alpha.exp()
            target = batch["reward"] + cfg.gamma * (1.0 - batch["done"]) * (next_q - alpha * next_logp)
        q = self.model.critic(batch["observation"], batch["action"])
        return 0.5 * ((q - target.unsqueeze(0)) ** 2).sum(dim=0).mean()

    def update(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """One step of the critics, then the actor and the temperature, then the target critics."""
        cfg = self.config
        b = {k: torch.as_tensor(np.asarray(batch[k]), dtype=torch.float32, device=self.device)
             for k in ("observation", "action", "reward", "next_observation", "done")}
        opt = self.optimizer.optimizers
        critic_loss = self.critic_loss(b)
        opt["critic"].zero_grad(set_to_none=True)
        critic_loss.backward()
        nn.utils.clip_grad_norm_(self.model.critic.parameters(), cfg.max_grad_norm)
        opt["critic"].step()

        action, logp = self.sample(b["observation"])
        self.model.critic.requires_grad_(False)
        q = self.model.critic(b["observation"], action).min(dim=0).values
        self.model.critic.requires_grad_(True)
        alpha = self.model.log_alpha.exp().detach()
        actor_loss = (alpha * logp - q).mean()
        opt["actor"].zero_grad(set_to_none=True)
        actor_loss.backward()
        nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
        opt["actor"].step()

        alpha_loss = -(self.model.log_alpha * (logp.detach() + self.target_entropy)).mean()
        opt["alpha"].zero_grad(set_to_none=True)
        alpha_loss.backward()
        opt["alpha"].step()

        with torch.no_grad():
            for p, tp in zip(self.model.critic.parameters(), self.model.target.parameters(), strict=True):
                tp.lerp_(p, cfg.tau)
        self.steps += 1
        return {"critic_loss": float(critic_loss.detach()), "actor_loss": float(actor_loss.detach()),
                "q": float(q.detach().mean()), "alpha": float(alpha), "entropy": float(-logp.detach().mean()),
                "log_std": float(self.policy.log_std.detach().mean())}
