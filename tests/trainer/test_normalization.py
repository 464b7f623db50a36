"""Observation normalisation inside the served policy, and the critic's return normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protos.codec import Spec
from tests.trainer.test_ppo import synthetic_segments
from trainer.policy import GaussianPolicy
from trainer.ppo import ActorCritic, PPOConfig, PPOLearner

OBS = Spec("observation", np.float32, (4,))
ACT = Spec("action", np.float32, (1,), low=(-3.0,), high=(3.0,))


def moments(x: np.ndarray) -> tuple[float, torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(x).double()
    return float(len(x)), x.sum(0), (x ** 2).sum(0)


def test_running_statistics_equal_those_of_all_batches_together():
    policy = GaussianPolicy(OBS, ACT, seed=0)
    rng = np.random.default_rng(0)
    batches = [rng.normal(loc=[0.0, 5.0, -2.0, 0.1], scale=[1.0, 0.1, 3.0, 20.0], size=(n, 4)) for n in (7, 300, 51)]
    for b in batches:
        policy.update_normalizer(*moments(b))
    every = np.concatenate(batches)
    np.testing.assert_allclose(policy.obs_mean.numpy(), every.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(policy.obs_std.numpy(), every.std(0), rtol=1e-5)
    assert float(policy.obs_count) == len(every)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_the_served_torchscript_normalises_like_the_trainer():
    policy = GaussianPolicy(OBS, ACT, seed=0)
    obs = torch.randn(32, 4) * torch.tensor([1.0, 0.05, 4.0, 30.0]) + 3.0
    identity = policy.mean(obs).clone()
    policy.update_normalizer(*moments(obs.numpy()))
    scripted = torch.jit.script(policy)
    with torch.no_grad():
        _, _, mean = scripted(obs)
        torch.testing.assert_close(mean, policy.mean(obs))
        torch.testing.assert_close(policy.net(policy.normalize(obs)).abs().max() < 10, torch.tensor(True))
    assert not torch.allclose(identity, mean)  # the statistics changed the function
    served = GaussianPolicy(OBS, ACT, seed=1)
    served.load_state_dict(scripted.state_dict(), strict=True)  # they travel with the weights
    torch.testing.assert_close(served.mean(obs), policy.mean(obs))


def test_weights_from_before_the_normaliser_load_as_the_identity():
    policy = GaussianPolicy(OBS, ACT, seed=0)
    old = {k: v for k, v in policy.state_dict().items() if not k.startswith("obs_")}
    other = GaussianPolicy(OBS, ACT, seed=3)
    other.obs_std.fill_(7.0)
    other.load_state_dict(old, strict=True)
    obs = torch.randn(5, 4)
    torch.testing.assert_close(other.mean(obs), policy.mean(obs))
    with pytest.raises(RuntimeError, match="net.0.weight"):
        other.load_state_dict({k: v for k, v in old.items() if k != "net.0.weight"}, strict=True)


def test_new_return_statistics_keep_the_critics_values():
    model = ActorCritic(GaussianPolicy(OBS, ACT, seed=0), 4, (16, 16))
    obs = torch.randn(20, 4)
    before = model.value(obs).detach().clone()
    model.set_return_stats(55.0, 12.5)
    torch.testing.assert_close(model.value(obs), before, rtol=1e-5, atol=1e-4)
    model.set_return_stats(-3.0, 0.5)
    torch.testing.assert_close(model.value(obs), before, rtol=1e-5, atol=1e-4)


def test_an_update_with_both_normalisations_moves_the_statistics():
    learner = PPOLearner(GaussianPolicy(OBS, ACT, seed=0), seed=0,
                         config=PPOConfig(epochs=2, minibatches=2, normalize_obs=True, normalize_value=True))
    stats = learner.update(synthetic_segments([1] * 64).take(), newest_version=1)
    assert all(np.isfinite(v) for v in stats.values())
    assert float(learner.policy.obs_count) == 64 and not torch.allclose(learner.policy.obs_std, torch.ones(4))
    assert float(learner.model.ret_mean) > 1.0  # 64 steps of reward 1, gamma 0.99: returns well above 1
    with pytest.raises(ValueError, match="value_norm_decay"):
        PPOConfig(value_norm_decay=1.0)
