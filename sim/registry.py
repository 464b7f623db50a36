"""One environment registry: every env id `tether sim`, the gate's evaluator (which runs `tether sim`) and the
demo accept, made by one function.

    env = sim.make("Hopper-v5", seed=0)                      # one env (gymnasium MuJoCo *-v5, "PointMass")
    env = sim.make("newton:cartpole", num_envs=64, seed=0)   # a vector env (newton:, isaaclab:, mujoco:, serial:)
    env = sim.make("Hopper-v5", num_envs=8)                  # a plain id with num_envs: gymnasium's vector env

Ids with a registered prefix (`register_vector`) are vector envs (num_envs defaults to 1); a plain id is a single
env unless `num_envs` is given. Keyword arguments (seed, max_episode_steps, device, ...) go to the adapter. Adapters
are imported on first use, so `import sim` pulls in no simulator. A new vector adapter (a subclass of
`sim.vector.BaseVectorEnvironment` in its own module) is one `register_vector(prefix, factory)` line below.

    >>> env = make("PointMass", seed=0)
    >>> [s.name for s in env.action_spec()], is_vector("PointMass"), is_vector("newton:ant")
    (['action'], False, True)
    >>> make("serial:PointMass", num_envs=3).num_envs
    3
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.vector import VectorEnvironment

__all__ = ["is_vector", "make", "make_vector_env", "register_vector"]

_FACTORIES: dict[str, Callable[..., VectorEnvironment]] = {}  # `--env` prefixes of vector envs


def is_vector(env_id: str) -> bool:
    """`newton:cartpole`, `isaaclab:...`, `mujoco:Hopper-v5`, `serial:PointMass`: a name only vector envs have."""
    return env_id.partition(":")[0] in _FACTORIES


def make(env_id: str, *, num_envs: int | None = None, **kw: Any):
    """The environment `env_id` names: an `Environment`, or a `VectorEnvironment` of `num_envs` envs."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"an env id is a non-empty name such as 'Hopper-v5' or 'newton:cartpole', got {env_id!r}")
    if num_envs is not None or is_vector(env_id):
        return make_vector_env(env_id, num_envs=1 if num_envs is None else num_envs, **kw)
    from sim.mujoco import make_env

    return make_env(env_id, **kw)


def register_vector(prefix: str, factory: Callable[..., VectorEnvironment]) -> None:
    """Make `make_vector_env(f"{prefix}:{task}", **kw)` call `factory(task, **kw)`."""
    _FACTORIES[prefix] = factory


def make_vector_env(name: str, *, num_envs: int, **kw: Any) -> VectorEnvironment:
    """A vector env by name: `newton:<task>`, `isaaclab:<task id>`, `mujoco:<id>` or a gymnasium id,
    or `serial:<name>` (N single envs from `sim.mujoco.make_env`, e.g. "serial:PointMass").

    Keyword arguments (seed, max_episode_steps, device, ...) go to the adapter.
    """
    prefix, sep, task = name.partition(":")
    if not sep:
        prefix, task = "gymnasium", name
    if prefix not in _FACTORIES:
        raise ValueError(f"unknown vector env {name!r}: the prefix {prefix!r} is not one of {sorted(_FACTORIES)}")
    if not task:
        raise ValueError(f"vector env {name!r} names no task after {prefix!r}:")
    return _FACTORIES[prefix](task, num_envs=num_envs, **kw)


# each adapter's module is imported when its first env is made (gymnasium, Newton and Isaac Lab are heavy)
def _gymnasium(task: str, **kw: Any) -> VectorEnvironment:
    from sim.gym_vector import GymnasiumVectorEnv

    return GymnasiumVectorEnv(task, **kw)


def _newton(task: str, **kw: Any) -> VectorEnvironment:
    from sim.newton_tasks import make_newton_task

    return make_newton_task(task, **kw)


def _serial(task: str, **kw: Any) -> VectorEnvironment:
    from sim.serial_vector import make_serial

    return make_serial(task, **kw)


def _isaaclab(task: str, **kw: Any) -> VectorEnvironment:
    from sim.isaaclab import make_isaaclab_env

    return make_isaaclab_env(task, **kw)


register_vector("gymnasium", _gymnasium)
register_vector("mujoco", _gymnasium)
register_vector("newton", _newton)
register_vector("isaaclab", _isaaclab)
register_vector("serial", _serial)
