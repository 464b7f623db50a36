"""One environment registry: every env id `tether sim`, the gate's evaluator (which runs `tether sim`) and the
demo accept, made by one function.

    env = sim.make("Hopper-v5", seed=0)                      # one env (gymnasium MuJoCo *-v5, "PointMass")
    env = sim.make("newton:cartpole", num_envs=64, seed=0)   # a vector env (newton:, isaaclab:, mujoco:, serial:)
    env = sim.make("Hopper-v5", num_envs=8)                  # a plain id with num_envs: gymnasium's vector env

Ids with a prefix in `VECTOR_PREFIXES` are vector envs (num_envs defaults to 1); a plain id is a single env unless
`num_envs` is given. Keyword arguments (seed, max_episode_steps, device, ...) go to the adapter. Adapters are
imported on first use, so `import sim` pulls in no simulator.

    >>> env = make("PointMass", seed=0)
    >>> [s.name for s in env.action_spec()], is_vector("PointMass"), is_vector("newton:ant")
    (['action'], False, True)
    >>> make("serial:PointMass", num_envs=3).num_envs
    3
"""

from __future__ import annotations

from typing import Any

__all__ = ["VECTOR_PREFIXES", "is_vector", "make"]

VECTOR_PREFIXES = ("newton", "isaaclab", "mujoco", "gymnasium", "serial")  # `--env` names of vector envs


def is_vector(env_id: str) -> bool:
    """`newton:cartpole`, `isaaclab:...`, `mujoco:Hopper-v5`, `serial:PointMass`: a name only vector envs have."""
    return env_id.partition(":")[0] in VECTOR_PREFIXES


def make(env_id: str, *, num_envs: int | None = None, **kw: Any):
    """The environment `env_id` names: an `Environment`, or a `VectorEnvironment` of `num_envs` envs."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"an env id is a non-empty name such as 'Hopper-v5' or 'newton:cartpole', got {env_id!r}")
    if num_envs is not None or is_vector(env_id):
        from sim.vector import make_vector_env

        return make_vector_env(env_id, num_envs=1 if num_envs is None else num_envs, **kw)
    from sim.mujoco import make_env

    return make_env(env_id, **kw)
