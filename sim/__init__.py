"""Simulator adapters behind one environment contract, and the client that connects them to the gateway.

- `sim.make(env_id, num_envs=None, **kw)` (`sim.registry`): the one environment registry (`Hopper-v5`,
  `PointMass`, `newton:*`, `isaaclab:*`, `mujoco:*`, `serial:*`), used by `tether sim`, the gate and the demo;
  `make_vector_env("newton:ant" | "isaaclab:<task>" | "Hopper-v5", num_envs=N)`, `register_vector(prefix, factory)`.
- `sim.env`: `Environment` (the contract), `TimeStep`, `StepType`, `BaseEnvironment`.
- `sim.mujoco`: `GymnasiumEnv` (gymnasium MuJoCo `*-v5`), `make_env(name, **kw)`.
- `sim.toy`: `PointMass`, a pure-numpy env for tests.
- `sim.cameras`: `with_cameras(env, names, size=224)`, MuJoCo cameras rendered offscreen (EGL) as uint8 image tensors.
- `sim.camera_reach`: `CameraReach`, a MuJoCo task whose goal shows only in the images, and its scripted expert.
- `sim.contract`: `EnvironmentContract`, the test suite every adapter passes.
- `sim.client`: `run_sessions(...)`; `sim.cli`: `main(argv)` for `tether sim`.
- `sim.vector`: `VectorEnvironment` (N envs as one batch, same-step auto-reset, per-env refusal),
  `VectorTimeStep`, `BaseVectorEnvironment`.
- `sim.gym_vector`: `GymnasiumVectorEnv` (gymnasium `SyncVectorEnv`, e.g. over MuJoCo `*-v5`).
- `sim.newton_tasks`: NVIDIA Newton tasks (`NewtonCartpole`, `NewtonAnt`), N worlds in one model.
- `sim.serial_vector`: `SerialVectorEnv` (`serial:<name>`), N single envs behind the vector contract.
- `sim.isaaclab`: `IsaacLabVectorEnv` (Isaac Lab's torch vector interface), `make_isaaclab_env(task, ...)`.
- `sim.vector_contract`: `VectorEnvironmentContract`, the suite every vector adapter passes.
"""

from sim.env import BaseEnvironment, Environment, ResetRequired, StepType, TimeStep
from sim.registry import is_vector, make

__all__ = ["BaseEnvironment", "Environment", "ResetRequired", "StepType", "TimeStep", "is_vector", "make"]
