"""Simulator adapters behind one environment contract, and the client that connects them to the gateway.

- `sim.env`: `Environment` (the contract), `TimeStep`, `StepType`, `BaseEnvironment`.
- `sim.mujoco`: `GymnasiumEnv` (gymnasium MuJoCo `*-v5`), `make_env(name, **kw)`.
- `sim.toy`: `PointMass`, a pure-numpy env for tests.
- `sim.contract`: `EnvironmentContract`, the test suite every adapter passes.
- `sim.client`: `run_sessions(...)` and `main(argv)` for `tether sim`.
"""

from sim.env import BaseEnvironment, Environment, ResetRequired, StepType, TimeStep

__all__ = ["BaseEnvironment", "Environment", "ResetRequired", "StepType", "TimeStep"]
