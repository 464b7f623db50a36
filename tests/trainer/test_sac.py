"""SAC's pieces: the replay ring, RLPD's symmetric sampling, interventions and demonstrations routed to the
offline half on the applied action, seed logs read from MCAP, and SAC updates that learn (a critic loss
that falls on a fixed batch; an actor that moves to the best action of a bandit)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from protos import bridge_pb2, codec, experience_pb2
from protos.codec import Spec
from trainer.algorithms.sac import seed_replay
from trainer.main import main as train_main
from trainer.policy import GaussianPolicy, MLPPolicy
from trainer.replay import MixedReplay, ReplayAdder, ReplayBuffer
from trainer.sac import SACConfig, SACLearner
from trainer.sources import write_transitions

OBS, ACT = Spec("observation", np.float32, (2,)), Spec("action", np.float32, (1,), low=(-3.0,), high=(3.0,))


def tr(step: int, *, session: str = "s", episode: int = 0, person: bool = False, action: float = 5.0,
       applied: float = 3.0, terminated: bool = False, truncated: bool = False,
       next_obs: float | None = None, offset: int = 0) -> experience_pb2.Transition:
    t = experience_pb2.Transition(
        offset=offset, session=session, episode=episode, step=step, reward=1.0, intervention=person,
        step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID, terminated=terminated, truncated=truncated,
        policy="p", observation=[codec.encode("observation", np.full(2, step, np.float32))],
        action=[codec.encode("action", np.full(1, action, np.float32))],
        applied_action=[codec.encode("action", np.full(1, applied, np.float32))])
    if next_obs is not None:
        t.next_observation.extend([codec.encode("observation", np.full(2, next_obs, np.float32))])
    return t


def test_the_ring_keeps_the_newest_capacity_rows():
    buffer = ReplayBuffer(capacity=5, observation_size=1, action_size=1)
    for i in range(12):
        buffer.add([i], [i], float(i), [i + 1], i % 2 == 0)
    assert len(buffer) == 5 and buffer.added == 12
    assert sorted(buffer.observation.ravel().tolist()) == [7, 8, 9, 10, 11]
    batch = buffer.sample(64, np.random.default_rng(0))
    assert set(batch["observation"].ravel().tolist()) <= {7, 8, 9, 10, 11}
    np.testing.assert_array_equal(batch["next_observation"], batch["observation"] + 1)  # rows stay whole
    np.testing.assert_array_equal(batch["done"], (batch["observation"].ravel() % 2 == 0).astype(np.float32))
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity=0, observation_size=1, action_size=1)


@pytest.mark.parametrize("n", [256, 7, 1])
def test_a_batch_takes_half_its_rows_from_each_buffer(n):
    replay = MixedReplay(capacity=100, observation_size=1, action_size=1)
    for _ in range(50):
        replay.online.add([1.0], [0], 0.0, [1.0], False)
    for _ in range(3):  # a small offline buffer still gives half of every batch (sampled with replacement)
        replay.offline.add([-1.0], [0], 0.0, [-1.0], False)
    batch = replay.sample(n, np.random.default_rng(n))
    online = int((batch["observation"].ravel() > 0).sum())
    assert online == n // 2 and n - online == n - n // 2
    np.testing.assert_array_equal(batch["from_offline"], batch["observation"].ravel() < 0)


def test_with_one_buffer_empty_every_row_comes_from_the_other():
    replay = MixedReplay(capacity=10, observation_size=1, action_size=1)
    with pytest.raises(ValueError, match="empty"):
        replay.sample(4, np.random.default_rng(0))
    replay.offline.add([-1.0], [0], 0.0, [-1.0], False)      # seeds only (before the first live step)
    assert replay.sample(8, np.random.default_rng(0))["from_offline"].all()
    replay = MixedReplay(capacity=10, observation_size=1, action_size=1)
    replay.online.add([1.0], [0], 0.0, [1.0], False)
    assert not replay.sample(8, np.random.default_rng(0))["from_offline"].any()


def test_interventions_go_to_the_demo_half_and_are_learned_on_the_persons_action():
    replay = MixedReplay(capacity=100, observation_size=2, action_size=1)
    adder = ReplayAdder(replay, observation="observation", action="action")
    people = {3, 4, 7}
    for step in range(10):  # the policy sampled 5.0 (the actuator clipped it to 3.0); a person applied -2.0
        adder.add(tr(step, person=step in people, applied=-2.0 if step in people else 3.0,
                     terminated=step == 9))
    assert len(replay.offline) == 3 and len(replay.online) == 7 and adder.interventions == 3
    assert sorted(replay.offline.observation[:3, 0].tolist()) == [3, 4, 7]
    assert replay.offline.action[:3].ravel().tolist() == [-2.0, -2.0, -2.0]      # the person's, applied
    assert replay.online.action[:7].ravel().tolist() == [5.0] * 7               # the policy's own sample
    # s' is the successor's observation; the terminal step is done
    np.testing.assert_array_equal(replay.online.next_observation[:6, 0], replay.online.observation[:6, 0] + 1)
    assert replay.online.done[:7].tolist() == [0.0] * 6 + [1.0]


def test_truncation_bootstraps_from_next_observation_and_a_gap_drops_the_step():
    replay = MixedReplay(capacity=100, observation_size=2, action_size=1)
    adder = ReplayAdder(replay, observation="observation", action="action")
    adder.add(tr(0))
    adder.add(tr(1))
    adder.add(tr(5))                                  # steps 2-4 never came: step 1 has no successor
    adder.add(tr(6, truncated=True, next_obs=42.0))
    rows = {int(o): (float(n), float(d)) for o, n, d in zip(replay.online.observation[:len(replay.online), 0],
                                                            replay.online.next_observation[:, 0],
                                                            replay.online.done, strict=False)}
    assert rows == {0: (1.0, 0.0), 5: (6.0, 0.0), 6: (42.0, 0.0)} and adder.dropped == 1
    adder.add(tr(0, session="b", episode=0))
    adder.add(tr(1, session="b", episode=0, terminated=True))
    assert adder.take_episode_returns() == [4.0, 2.0]  # the episodes seen from their first step, as they end
    assert adder.take_episode_returns() == []


def test_seed_logs_fill_the_offline_half_and_demonstrations_learn_the_applied_action(tmp_path):
    rows = [tr(i % 20, session=f"s{i // 20}", offset=i, terminated=i % 20 == 19) for i in range(60)]
    (tmp_path / "old").mkdir()
    (tmp_path / "demo").mkdir()
    write_transitions(tmp_path / "old" / "seg-000.mcap", rows)
    write_transitions(tmp_path / "demo" / "seg-000.mcap", rows[:20])
    replay = MixedReplay(capacity=1000, observation_size=2, action_size=1)
    expect = (OBS, ACT)
    seeds = ReplayAdder(replay, observation="observation", action="action", offline=True)
    assert seed_replay(seeds, [str(tmp_path / "old")], policy=None, expect=expect) == 60
    assert len(replay.offline) == 60 and len(replay.online) == 0
    assert set(replay.offline.action[:60].ravel().tolist()) == {5.0}           # a previous policy's own samples
    demos = ReplayAdder(replay, observation="observation", action="action", demos=True)
    assert seed_replay(demos, [str(tmp_path / "demo")], policy=None, expect=expect) == 20
    assert replay.offline.action[60:80].ravel().tolist() == [3.0] * 20          # demonstrations: applied
    misfit = (Spec("observation", np.float32, (3,)), ACT)                        # another policy's log: skipped
    other = MixedReplay(capacity=10, observation_size=3, action_size=1)
    assert seed_replay(ReplayAdder(other, observation="observation", action="action", offline=True),
                       [str(tmp_path / "old")], policy=None, expect=misfit) == 0


def _batch(rng: np.random.Generator, n: int = 256) -> dict[str, np.ndarray]:
    action = rng.uniform(-3, 3, size=(n, 1)).astype(np.float32)
    return {"observation": rng.normal(size=(n, 2)).astype(np.float32), "action": action,
            "reward": (-(action[:, 0] - 1.0) ** 2).astype(np.float32),
            "next_observation": rng.normal(size=(n, 2)).astype(np.float32), "done": np.ones(n, np.float32)}


def test_sac_fits_the_critic_on_a_fixed_batch_and_moves_the_actor_to_the_best_action():
    """A one-step bandit (done = 1): Q(s, a) = -(a - 1)^2. The critic's loss on the fixed batch falls, the
    served policy's mean moves from 0 to the best action 1, and the temperature drives the entropy down."""
    torch.manual_seed(0)
    policy = GaussianPolicy(OBS, ACT, seed=0, log_std_init=0.0)
    learner = SACLearner(policy, config=SACConfig(critic_hidden=(64, 64), actor_lr=3e-3, critic_lr=3e-3), seed=0)
    batch = _batch(np.random.default_rng(0))
    tensors = {k: torch.as_tensor(v) for k, v in batch.items()}
    with torch.no_grad():
        before = float(learner.critic_loss(tensors))
    first = learner.update(batch)
    for _ in range(400):
        stats = learner.update(batch)
    with torch.no_grad():
        after = float(learner.critic_loss(tensors))
    assert after < 0.1 * before, (before, after)
    with torch.no_grad():
        mean = policy.mean(tensors["observation"]).mean().item()
    assert abs(mean - 1.0) < 0.3, mean
    assert stats["log_std"] < first["log_std"] and learner.steps == 401


def test_sac_needs_a_stochastic_policy_and_checks_its_config():
    with pytest.raises(TypeError, match="GaussianPolicy"):
        SACLearner(MLPPolicy(OBS, ACT, seed=0))
    with pytest.raises(ValueError, match="tau"):
        SACConfig(tau=0.0)


@pytest.mark.parametrize("argv, message", [
    (["--algo", "sac", "--gateway", "127.0.0.1:1", "--seconds", "1", "--nproc", "2"], "one rank"),
    (["--algo", "sac", "--seconds", "1"], "needs --gateway"),
    (["--algo", "sac", "--gateway", "127.0.0.1:1", "--seconds", "1", "--seed-log", "/nonexistent"], "--seed-log"),
    (["--algo", "ppo", "--gateway", "127.0.0.1:1", "--seconds", "1", "--demos", "/tmp"], "SAC's"),
    (["--algo", "sac", "--gateway", "127.0.0.1:1", "--seconds", "1", "--tau", "2"], "--tau"),
])
def test_tether_train_refuses_a_bad_sac_command_naming_the_flag(argv, message):
    with pytest.raises(SystemExit, match=message):
        train_main(argv)
