"""NVIDIA Newton tasks: the vector contract suite, plus checks that the worlds are independent and
the physics behaves (on the CPU through Warp; the CUDA comparison runs where a GPU is)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.newton_tasks import NewtonAnt, NewtonCartpole, NewtonDoubleCartpole, make_newton_task
from sim.registry import make_vector_env
from sim.vector_contract import VectorEnvironmentContract


class TestNewtonCartpole(VectorEnvironmentContract):
    def make_env(self, *, num_envs, seed=None):
        return NewtonCartpole(num_envs=num_envs, seed=seed, max_episode_steps=100)


class TestNewtonAnt(VectorEnvironmentContract):
    num_envs = 3
    steps = 20
    mixed_episode_ends = False  # random torques rarely topple it: episodes end by the time limit

    def make_env(self, *, num_envs, seed=None):
        return make_vector_env("newton:ant", num_envs=num_envs, seed=seed, max_episode_steps=12)


@pytest.mark.parametrize("task", ["cartpole", "double_cartpole", "ant"])
def test_worlds_do_not_interact(task):
    """Worlds share one model (and, for the ant, one ground plane at one origin): what env 0 does
    must not change envs 1..N-1 by a single bit."""
    a, b = make_newton_task(task, num_envs=3, seed=1), make_newton_task(task, num_envs=3, seed=1)
    a.reset(), b.reset()
    rng = np.random.default_rng(0)
    width = a.action_spec()[0].shape[0]
    for _ in range(15):
        action = rng.uniform(-1, 1, (3, width)).astype(np.float32)
        other = action.copy()
        other[0] = -1.0 if _ % 2 else 1.0
        ta, tb = a.step({"action": action}), b.step({"action": other})
        np.testing.assert_array_equal(ta.observation["observation"][1:], tb.observation["observation"][1:])
        np.testing.assert_array_equal(ta.reward[1:], tb.reward[1:])
    assert not np.array_equal(ta.observation["observation"][0], tb.observation["observation"][0])
    a.close(), b.close()


def test_a_world_reset_leaves_the_other_worlds_alone():
    a, b = NewtonCartpole(num_envs=3, seed=2), NewtonCartpole(num_envs=3, seed=2)
    a.reset(), b.reset()
    resets_a = resets_b = 0
    for _ in range(80):
        push = np.zeros((3, 1), np.float32)
        ta = a.step({"action": push + np.array([[1.0], [0.0], [0.0]], np.float32)})  # env 0 pushed over
        tb = b.step({"action": push})
        resets_a, resets_b = resets_a + ta.last()[0], resets_b + tb.last()[0]
        np.testing.assert_array_equal(ta.observation["observation"][1:], tb.observation["observation"][1:])
    assert resets_a != resets_b, "env 0 should end its episodes at other times in the two runs"


@pytest.mark.parametrize("task", ["cartpole", "ant"])
def test_the_captured_graph_replays_the_launches_exactly(task):
    captured, launched = make_newton_task(task, num_envs=3, seed=6), make_newton_task(task, num_envs=3, seed=6,
                                                                                        capture=False)
    assert captured._graph is not None and launched._graph is None
    a, b = captured.reset(), launched.reset()
    rng = np.random.default_rng(1)
    for _ in range(25):
        action = {"action": rng.uniform(-1, 1, (3, captured.action_spec()[0].shape[0])).astype(np.float32)}
        a, b = captured.step(action), launched.step(action)
        np.testing.assert_array_equal(a.final_observation["observation"], b.final_observation["observation"])
        np.testing.assert_array_equal(a.observation["observation"], b.observation["observation"])
    captured.close(), launched.close()


@pytest.mark.parametrize("cls", [NewtonCartpole, NewtonDoubleCartpole])
def test_cartpole_poles_fall_without_control_and_termination_costs(cls):
    env = cls(num_envs=4, seed=2, max_episode_steps=500)
    ts = env.reset()
    start = ts.observation["observation"].copy()
    ended = np.zeros(4, bool)
    for _ in range(300):
        ts = env.step({"action": np.zeros((4, 1), np.float32)})
        assert (ts.reward[ts.terminated] == -2.0).all()
        assert (ts.reward[~ts.terminated] <= 1.0).all()
        ended |= ts.terminated
        if ended.all():
            break
    assert ended.all(), "unactuated inverted poles must fall over (gravity acts)"
    final = ts.final_observation["observation"][ts.terminated]
    poles = np.cumsum(final[:, 1:1 + cls.poles], axis=1)  # absolute angles
    assert (np.abs(poles) > cls.max_angle - 0.2).any()
    assert not np.array_equal(ts.observation["observation"], start)
    env.close()


@pytest.mark.parametrize("cls", [NewtonCartpole, NewtonDoubleCartpole])
def test_cartpole_force_moves_the_cart_its_way(cls):
    env = cls(num_envs=2, seed=3)
    env.reset()
    for _ in range(10):
        ts = env.step({"action": np.array([[1.0], [-1.0]], np.float32)})
    velocity = ts.observation["observation"][:, 1 + cls.poles]
    assert velocity[0] > 0.5 and velocity[1] < -0.5, velocity
    env.close()


def test_cartpole_is_balanced_by_a_linear_controller_at_its_gear():
    """The single pole is balanceable with 20 N from every reset state: an LQR gain (from the task's
    own linearised dynamics, Q = diag(1, 10, 0.1, 0.1), R = 10) holds all 16 worlds for 500 steps;
    with no force they fall (the test above). The double's LQR holds about half: docs/simulators.md."""
    env = NewtonCartpole(num_envs=16, seed=0)
    assert env.observation_spec()[0].shape == (4,) and env.gear == 20.0
    gain = np.array([-0.3, 4.77, -0.51, 2.17], np.float32)
    ts = env.reset()
    for _ in range(500):
        action = np.clip(-ts.observation["observation"] @ gain, -1.0, 1.0)[:, None]
        ts = env.step({"action": action})
        assert not ts.terminated.any()
    assert ts.truncated.all() and (ts.reward > 0.9).all()
    env.close()


def test_the_double_cartpole_is_the_shipped_asset():
    single, double = make_newton_task("cartpole", num_envs=2), make_newton_task("double_cartpole", num_envs=2)
    assert (single._dofs, double._dofs) == (2, 3)
    assert double.observation_spec()[0].shape == (6,) and double.source == "newton:double_cartpole"
    single.close(), double.close()


def test_ant_stands_on_its_legs_without_torques():
    env = NewtonAnt(num_envs=2, seed=4, max_episode_steps=1000)
    env.reset()
    for _ in range(90):
        ts = env.step({"action": np.zeros((2, 8), np.float32)})
        assert not ts.last().any(), "an unactuated ant settles on its legs"
    height = ts.observation["observation"][:, 0]
    assert ((height > 0.35) & (height < 0.8)).all(), height
    np.testing.assert_allclose(ts.reward, 1.0, atol=0.2)  # healthy, barely moving, no torque cost
    env.close()


def test_newton_task_names_and_arguments():
    with pytest.raises(ValueError, match="unknown Newton task 'humanoid'.*'ant', 'cartpole'"):
        make_vector_env("newton:humanoid", num_envs=2)
    with pytest.raises(ValueError, match="max_episode_steps must be an int >= 1, got 0"):
        NewtonCartpole(num_envs=2, max_episode_steps=0)
    with pytest.raises(ValueError, match="num_envs must be an int >= 1, got -1"):
        NewtonCartpole(num_envs=-1)
    env = make_vector_env("newton:cartpole", num_envs=2)
    assert env.source == "newton:cartpole" and env.device == "cpu"
    env.close()


def _cuda_available() -> bool:
    import warp as wp

    return wp.is_cuda_available()


@pytest.mark.skipif(not _cuda_available(), reason="no CUDA device for Warp here: the Newton tasks run on the CPU "
                    "(the GPU path is the same code on device cuda:0)")
def test_cartpole_on_cuda_follows_the_cpu():
    assert NewtonCartpole(num_envs=1).device == "cuda:0", "CUDA is the default where present"
    gpu = NewtonCartpole(num_envs=8, seed=5, device="cuda:0")
    cpu = NewtonCartpole(num_envs=8, seed=5, device="cpu")
    a, b = cpu.reset(), gpu.reset()
    np.testing.assert_array_equal(a.observation["observation"], b.observation["observation"])
    for _ in range(20):
        action = {"action": np.full((8, 1), 0.3, np.float32)}
        a, b = cpu.step(action), gpu.step(action)
        np.testing.assert_allclose(a.observation["observation"], b.observation["observation"], atol=1e-3)


def test_a_world_that_blows_up_is_terminated_and_reset_alone():
    env = NewtonCartpole(num_envs=3, seed=7)
    env.reset()
    zero = {"action": np.zeros((3, 1), np.float32)}
    env.step(zero)
    qd = env._state.joint_qd.numpy().reshape(3, -1).copy()  # a solver blow-up in world 1, simulated
    qd[1] = np.nan
    env._state.joint_qd.assign(qd.ravel())
    ts = env.step(zero)
    assert ts.terminated.tolist() == [False, True, False] and ts.reward[1] == 0.0
    assert np.isfinite(ts.final_observation["observation"]).all() and np.isfinite(ts.observation["observation"]).all()
    for _ in range(5):
        ts = env.step(zero)
        assert not ts.last().any() and np.isfinite(ts.observation["observation"]).all()
    env.close()


def test_without_graph_capture_the_task_still_runs(monkeypatch, caplog):
    import warp as wp

    class NoCapture:
        def __init__(self, **kw):
            pass

        def __enter__(self):
            raise RuntimeError("capture is not supported here")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(wp, "ScopedCapture", NoCapture)
    with caplog.at_level("WARNING", logger="sim.newton_tasks"):
        env = NewtonCartpole(num_envs=2, seed=8)
    assert env._graph is None and "without a captured graph (capture is not supported here)" in caplog.text
    reference = NewtonCartpole(num_envs=2, seed=8, capture=False)
    a, b = env.reset(), reference.reset()
    push = {"action": np.ones((2, 1), np.float32)}
    for _ in range(5):
        a, b = env.step(push), reference.step(push)
    np.testing.assert_array_equal(a.observation["observation"], b.observation["observation"])
