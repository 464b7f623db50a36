"""sim.make: the one environment registry behind `tether sim`, the gate's evaluation runs and the demo."""

from __future__ import annotations

import pytest

import sim
from sim.env import Environment
from sim.vector import VectorEnvironment


def test_single_and_vector_ids():
    env = sim.make("PointMass", seed=3)
    assert isinstance(env, Environment) and not isinstance(env, VectorEnvironment)
    vec = sim.make("serial:PointMass", seed=3)            # a vector id: a vector env of one by default
    assert isinstance(vec, VectorEnvironment) and vec.num_envs == 1
    many = sim.make("serial:PointMass", num_envs=4, seed=3)
    assert many.num_envs == 4 and many.action_spec() == env.action_spec()
    first = env.reset().observation
    assert all((first[k] == many.reset().observation[k][0]).all() for k in first), "seed reaches env 0"


def test_a_gymnasium_id_with_num_envs_is_gymnasium_vector():
    pytest.importorskip("mujoco")
    vec = sim.make("InvertedPendulum-v5", num_envs=2, seed=0)
    try:
        assert isinstance(vec, VectorEnvironment) and vec.num_envs == 2
    finally:
        vec.close()


@pytest.mark.parametrize(("env_id", "message"), [("", "non-empty name"), ("newton:", "names no task"),
                                                 ("warp:ant", "unknown vector env")])
def test_bad_ids_say_what_is_wrong(env_id, message):
    with pytest.raises(ValueError, match=message):
        sim.make(env_id, num_envs=2) if ":" in env_id else sim.make(env_id)


def test_tether_sim_and_the_demo_use_it():
    from tether import topology

    assert topology.is_vector_env("newton:cartpole") and not topology.is_vector_env("Hopper-v5")
    assert sim.is_vector("isaaclab:Isaac-Cartpole-v0") and not sim.is_vector("PointMass")
