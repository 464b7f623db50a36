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


def _register_bounds(module: nn.Module, action: Spec) -> None:
    """Bounds as buffers, so they travel with the weights: a module rebuilt from specs without
    bounds (e.g. Triton's metadata) behaves like the served one once it loads its state_dict."""
    bounds = _bounds(action)
    low, high = bounds if bounds is not None else (torch.zeros(action.shape), torch.zeros(action.shape))
    module.register_buffer("bounded", torch.full(action.shape, bounds is not None))
    module.register_buffer("center", (high + low) / 2)
    module.register_buffer("half_range", (high - low) / 2)


def _squash(out: torch.Tensor, bounded: torch.Tensor, center: torch.Tensor, half_range: torch.Tensor) -> torch.Tensor:
    """`out` squashed into the bounds where the action is bounded."""
    return torch.where(bounded, center + half_range * torch.tanh(out), out)


def _hidden_layers(kind: str, observation: Spec, action: Spec, hidden: tuple[int, ...],
                   seed: int | None) -> tuple[list[nn.Module], int]:
    """The hidden layers from the observation vector (Linear + Tanh each, after `torch.manual_seed(seed)` when
    given) and the width of the last; ValueError unless both specs are vectors."""
    if len(observation.shape) != 1 or len(action.shape) != 1:
        raise ValueError(f"{kind} takes vectors, got {observation.name}{list(observation.shape)} "
                         f"-> {action.name}{list(action.shape)}")
    if seed is not None:
        torch.manual_seed(seed)
    sizes = (observation.shape[0], *hidden)
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return layers, sizes[-1]


class MLPPolicy(nn.Module):
    """A deterministic MLP from one float observation vector to one action vector, squashed into
    the action bounds when the spec has them."""

    def __init__(self, observation: Spec, action: Spec, *, hidden: tuple[int, ...] = (64, 64),
                 seed: int | None = None):
        super().__init__()
        layers, width = _hidden_layers("MLPPolicy", observation, action, hidden, seed)
        self.net = nn.Sequential(*layers, nn.Linear(width, action.shape[0]))
        self._register_bounds(action)

    _register_bounds = _register_bounds

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return _squash(self.net(observation), self.bounded, self.center, self.half_range)


_LOG_SQRT_2PI = 0.9189385332046727  # log(sqrt(2 pi))


class GaussianPolicy(nn.Module):
    """A stochastic MLP policy for PPO: a diagonal Gaussian around a (bounded) mean.

    `forward(observation) -> (action, log_prob, action_mean)` samples inside TorchScript (so
    Triton serves the sampling): action = mean + exp(log_std) * randn, log_prob of that action,
    shape (B, 1), and the deterministic mean (what probes compare). The mean is squashed into
    the action bounds when the spec has them; the sample is not clipped (the actuator clips).

        >>> import numpy as np, torch
        >>> from protos.codec import Spec
        >>> policy = GaussianPolicy(Spec("observation", np.float32, (4,)),
        ...                         Spec("action", np.float32, (1,), low=(-3.0,), high=(3.0,)), seed=0)
        >>> action, log_prob, mean = torch.jit.script(policy)(torch.zeros(5, 4))
        >>> tuple(action.shape), tuple(log_prob.shape), tuple(mean.shape)
        ((5, 1), (5, 1), (5, 1))
        >>> [s.name for s in GaussianPolicy.output_specs(Spec("action", np.float32, (1,)))]
        ['action', 'log_prob', 'action_mean']
    """

    def __init__(self, observation: Spec, action: Spec, *, hidden: tuple[int, ...] = (64, 64),
                 log_std_init: float = -0.5, seed: int | None = None):
        super().__init__()
        if not np.isfinite(log_std_init):
            raise ValueError(f"log_std_init must be finite, got {log_std_init}")
        layers, width = _hidden_layers("GaussianPolicy", observation, action, hidden, seed)
        head = nn.Linear(width, action.shape[0])
        with torch.no_grad():  # a small initial mean: the policy starts near the centre of the bounds
            head.weight.mul_(0.01)
            head.bias.zero_()
        self.net = nn.Sequential(*layers, head)
        self.log_std = nn.Parameter(torch.full((action.shape[0],), float(log_std_init)))
        self._register_bounds(action)
        # observation normalisation, part of the served function: (obs - obs_mean) / obs_std. The
        # trainer updates it (`update_normalizer`); the identity until then.
        self.register_buffer("obs_mean", torch.zeros(observation.shape[0]))
        self.register_buffer("obs_std", torch.ones(observation.shape[0]))
        self.register_buffer("obs_count", torch.zeros((), dtype=torch.float64))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # weights saved before the normaliser existed load as the identity normaliser
        for name, value in (("obs_mean", self.obs_mean.new_zeros(self.obs_mean.shape)),
                            ("obs_std", self.obs_std.new_ones(self.obs_std.shape)),
                            ("obs_count", self.obs_count.new_zeros(()))):
            state_dict.setdefault(prefix + name, value)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @staticmethod
    def output_specs(action: Spec) -> tuple[Spec, ...]:
        """The served outputs for `action`: (action, log_prob (1,), action_mean like action)."""
        return (action, Spec("log_prob", np.float32, (1,)), Spec("action_mean", np.float32, action.shape))

    _register_bounds = _register_bounds

    def normalize(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation - self.obs_mean) / self.obs_std

    def mean(self, observation: torch.Tensor) -> torch.Tensor:
        return _squash(self.net(self.normalize(observation)), self.bounded, self.center, self.half_range)

    @torch.jit.unused
    def update_normalizer(self, count: float, total: torch.Tensor, total_sq: torch.Tensor) -> None:
        """Fold a batch's moments (count, sum and sum of squares per element, float64) into the
        running observation mean/std (equal-weight average over every observation seen)."""
        if count <= 0:
            return
        with torch.no_grad():
            n0 = float(self.obs_count)
            mean0 = self.obs_mean.double()
            var0 = self.obs_std.double() ** 2 if n0 > 0 else torch.zeros_like(mean0)
            mean_b = total / count
            var_b = (total_sq / count - mean_b ** 2).clamp(min=0.0)
            n = n0 + count
            delta = mean_b - mean0
            mean = mean0 + delta * (count / n)
            var = (var0 * n0 + var_b * count + delta ** 2 * (n0 * count / n)) / n
            self.obs_mean.copy_(mean.to(self.obs_mean.dtype))
            self.obs_std.copy_(var.sqrt().clamp(min=1e-3).to(self.obs_std.dtype))
            self.obs_count.fill_(n)

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mean = self.mean(observation)
        noise = torch.randn_like(mean)
        action = mean + torch.exp(self.log_std) * noise
        # 0.9189... = log(sqrt(2 pi)); TorchScript cannot close over the module constant
        log_prob = (-0.5 * noise * noise - self.log_std - 0.9189385332046727).sum(dim=-1, keepdim=True)
        return action, log_prob, mean

    @torch.jit.unused
    def log_prob(self, observation: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probability of `action`, shape (B,), entropy per sample, shape (B,)) under this policy."""
        mean = self.mean(observation).float()
        log_std = self.log_std.float()
        z = (action.float() - mean) * torch.exp(-log_std)
        log_prob = (-0.5 * z * z - log_std - _LOG_SQRT_2PI).sum(dim=-1)
        entropy = (log_std + 0.5 + _LOG_SQRT_2PI).sum().expand(log_prob.shape[0])
        return log_prob, entropy


def probe_outputs(policy: nn.Module, probe: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The policy's deterministic outputs on `probe`, by served output name: what a publish sends for the gateway
    to compare with the served version's (`action_mean` of a GaussianPolicy, else `action`). A policy of several
    inputs (a camera policy: `policy.inputs`, `policy.outputs`) takes `probe` as {input name: batch}."""
    with torch.no_grad():
        if isinstance(probe, dict):
            device = next(policy.parameters()).device
            out = policy(*(torch.from_numpy(probe[s.name]).to(device) for s in policy.inputs))
            return {policy.outputs[0].name: out.float().cpu().numpy()}
        x = torch.from_numpy(probe).to(next(policy.parameters()).device)
        if isinstance(policy, GaussianPolicy):
            return {"action_mean": policy.mean(x).float().cpu().numpy()}
        return {"action": policy(x).float().cpu().numpy()}
