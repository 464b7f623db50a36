"""NVIDIA Newton tasks behind the `sim.vector` contract: N replicated worlds in one Newton model,
stepped as one batch through Warp (on the CPU here; on CUDA when a GPU is present).

    >>> import numpy as np
    >>> env = make_newton_task("cartpole", num_envs=8, seed=0)
    >>> ts = env.reset()
    >>> ts.observation["observation"].shape, env.action_spec()[0].shape
    ((8, 4), (1,))
    >>> ts = env.step({"action": np.zeros((8, 1), np.float32)})
    >>> ts.reward.shape, ts.last().any()
    ((8,), False)
    >>> env.close()

Tasks, built from the assets the `newton` wheel ships (`newton/examples/assets/`, nothing is
downloaded):

- "cartpole" (`NewtonCartpole`): `cartpole.urdf`'s cart on a rail with its first pole, balanced
  upright by a force on the cart; reduced-coordinate Featherstone solver, no contacts.
- "double_cartpole" (`NewtonDoubleCartpole`): the same with both of the asset's poles, in series.
- "ant" (`NewtonAnt`): `nv_ant.xml`, the four-legged MuJoCo ant on a ground plane, rewarded for
  running along +x; XPBD solver with contacts (what Newton's own legged examples use on CPU).

Per step the whole batch moves once each way: the actions (N, A) are scattered into one
`joint_f` array and copied to the device, the solver steps all worlds (one frame of collision and
solver launches replayed as a captured Warp graph: a CUDA graph on a GPU, Warp's C++ replay on
the CPU; `capture=False` launches them one by one), and `joint_q`/`joint_qd` come back in one
copy each; observations, rewards, terminations and the same-step auto-reset of ended worlds are
numpy over the batch (no per-env Python). Reset states come from `ResetNoise`: env i's
e-th episode starts from a hash of (seed, i, e), so a seeded env replays the same episodes, and
an env's start states do not depend on when the other envs reset.
A world whose state becomes non-finite (a solver blow-up) is terminated and reset; its final
observation has the non-finite values zeroed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from protos.codec import Spec
from sim.vector import BaseVectorEnvironment

__all__ = ["NewtonAnt", "NewtonCartpole", "NewtonDoubleCartpole", "NewtonTask", "ResetNoise", "make_newton_task",
           "newton_device"]

log = logging.getLogger(__name__)


def newton_device(device: str | None = None) -> str:
    """The Warp device to run on: `device` if given, else "cuda:0" when a GPU is usable, else "cpu"."""
    import warp as wp

    wp.config.quiet = True  # no banner, and no per-kernel-module load lines, on stdout
    wp.config.log_level = max(wp.config.log_level, wp.LOG_WARNING)
    if device is not None:
        return device
    return "cuda:0" if wp.is_cuda_available() else "cpu"


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise over uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class ResetNoise:
    """Per-env random streams without per-env Python: the k-th draw for env i's e-th episode is a
    hash of (seed, i, e, k), so env i's start states depend only on the seed and its own episode
    count, not on when the other envs reset.

    >>> a = ResetNoise(0).draws(np.array([0, 1, 2]))(-1.0, 1.0, 2)
    >>> b = ResetNoise(0).draws(np.array([2]))(-1.0, 1.0, 2)
    >>> a.shape, a.dtype.name, bool(np.array_equal(a[2], b[0])), bool((np.abs(a) <= 1).all())
    ((3, 2), 'float32', True, True)
    """

    def __init__(self, seed: int | None):
        if seed is None:
            seed = int(np.random.SeedSequence().entropy) & (2 ** 63 - 1)
        if not isinstance(seed, int | np.integer) or isinstance(seed, bool):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        self._key = _mix(np.array([int(seed) & (2 ** 64 - 1)], np.uint64))[0]
        self._episode = np.zeros(0, np.uint64)  # per env: episodes started so far

    def draws(self, rows: np.ndarray) -> Callable[[float, float, int], np.ndarray]:
        """A `noise(low, high, width) -> (len(rows), width)` for the next episode of each env in `rows`."""
        rows = np.asarray(rows, np.int64)
        if self._episode.size <= rows.max(initial=-1):
            self._episode = np.concatenate([self._episode, np.zeros(rows.max() + 1 - self._episode.size, np.uint64)])
        with np.errstate(over="ignore"):
            base = _mix(self._key ^ _mix(rows.astype(np.uint64) + np.uint64(1)))
            base = _mix(base ^ _mix(self._episode[rows] + np.uint64(1)))
        self._episode[rows] += np.uint64(1)
        calls = [0]

        def noise(low: float, high: float, width: int) -> np.ndarray:
            calls[0] += 1
            with np.errstate(over="ignore"):
                stream = _mix(base + np.uint64(calls[0]) * _GOLDEN)
                bits = _mix(stream[:, None] + np.arange(1, width + 1, dtype=np.uint64) * _GOLDEN)
            unit = (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
            return (low + (high - low) * unit).astype(np.float32)

        return noise


class NewtonTask(BaseVectorEnvironment):
    """N copies of one robot in one Newton model; subclasses describe the robot and the task.

    Subclasses set `solver` ("featherstone": reduced coordinates; "xpbd": maximal coordinates,
    joint coordinates recovered with `eval_ik` each step), `ground` (a ground plane and contacts),
    the action scaling (`actuated` dof indices, `gear`), and implement `_build`, `_initial`,
    `_observe` and `_reward`.
    """

    task = ""
    solver = "featherstone"
    ground = False
    frame_dt = 1.0 / 60.0
    substeps = 4
    default_max_episode_steps = 500
    actuated: tuple[int, ...] = ()
    gear = 1.0

    def __init__(self, *, num_envs: int, seed: int | None = None, max_episode_steps: int | None = None,
                 device: str | None = None, capture: bool = True, observation_spec: tuple[Spec, ...],
                 action_spec: tuple[Spec, ...]):
        import newton
        import warp as wp

        super().__init__(num_envs=num_envs, observation_spec=observation_spec, action_spec=action_spec)
        max_episode_steps = self.default_max_episode_steps if max_episode_steps is None else max_episode_steps
        if not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be an int >= 1, got {max_episode_steps!r}")
        self.max_episode_steps = max_episode_steps
        if self.substeps % 2:
            raise ValueError(f"{self.task}: substeps must be even, got {self.substeps}")
        self.device = newton_device(device)
        self.source = f"newton:{self.task}"
        self._wp, self._newton = wp, newton
        robot = newton.ModelBuilder()
        self._build(robot)
        scene = newton.ModelBuilder()
        if self.ground:
            scene.add_ground_plane()
        scene.replicate(robot, num_envs)  # every world at the origin; worlds do not collide with each other
        self._model = model = scene.finalize(device=self.device)
        if model.articulation_count != num_envs:
            raise ValueError(f"{self.task}: expected one articulation per world, got {model.articulation_count}")
        self._coords = model.joint_coord_count // num_envs
        self._dofs = model.joint_dof_count // num_envs
        if self.solver == "featherstone":
            self._solver = newton.solvers.SolverFeatherstone(model)
        elif self.solver == "xpbd":
            self._solver = newton.solvers.SolverXPBD(model, iterations=2)
        else:
            raise ValueError(f"{self.task}: unknown solver {self.solver!r}")
        self._pipeline = newton.CollisionPipeline(model, deterministic=True) if self.ground else None
        self._contacts = self._pipeline.contacts() if self._pipeline is not None else None
        self._state, self._next, self._control = model.state(), model.state(), model.control()
        self._forces = np.zeros((num_envs, self._dofs), np.float32)
        self._mask = wp.zeros(num_envs, dtype=bool, device=self.device)
        self._graph = self._capture() if capture else None
        self._noise = ResetNoise(seed)
        self._t = np.zeros(num_envs, np.int64)
        self._q = np.zeros((num_envs, self._coords), np.float32)
        self._qd = np.zeros((num_envs, self._dofs), np.float32)
        self._closed = False

    # -- the task: numpy over the batch ------------------------------------------------------

    def _build(self, builder: Any) -> None:
        raise NotImplementedError

    def _initial(self, noise: Callable[..., np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Reset states for some worlds: joint_q (k, coords) and joint_qd (k, dofs); draw randomness
        with `noise(low, high, width)` -> (k, width) float32, the calls always in the same order."""
        raise NotImplementedError

    def _observe(self, q: np.ndarray, qd: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _reward(self, q_before: np.ndarray, q: np.ndarray, qd: np.ndarray,
                action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(reward, terminated) for the step from `q_before` to (`q`, `qd`) under `action`."""
        raise NotImplementedError

    # -- the simulator ----------------------------------------------------------------------

    def _write(self, rows: np.ndarray | None) -> None:
        """Copy the host joint state to the device and update body poses (only `rows` if given)."""
        state = self._state
        state.joint_q.assign(self._q.ravel())
        state.joint_qd.assign(self._qd.ravel())
        mask = None
        if rows is not None:
            host = np.zeros(self.num_envs, bool)
            host[rows] = True
            self._mask.assign(host)
            mask = self._mask
        self._newton.eval_fk(self._model, state.joint_q, state.joint_qd, state, mask=mask)

    def _read(self) -> None:
        state = self._state
        if self.solver != "featherstone":
            self._newton.eval_ik(self._model, state, state.joint_q, state.joint_qd)
        self._q = state.joint_q.numpy().reshape(self.num_envs, self._coords).copy()
        self._qd = state.joint_qd.numpy().reshape(self.num_envs, self._dofs).copy()

    def _capture(self) -> Any:
        """Record one frame of kernel launches as a Warp graph (CUDA graph on a GPU, Warp's C++ replay
        on the CPU): replaying it skips the Python cost of each launch (~60 per frame, 90% of a
        step on the CPU). None, and plain launches, where capture fails."""
        states = self._state, self._next
        try:
            with self._wp.ScopedCapture(device=self.device) as capture:
                self._run_frame()
        except Exception as e:  # a solver or device that cannot be captured still runs, just slower
            log.warning("newton:%s: running without a captured graph (%s)", self.task, e)
            self._state, self._next = states
            return None
        return capture.graph

    def _simulate(self) -> None:
        if self._graph is not None:
            self._wp.capture_launch(self._graph)
        else:
            self._run_frame()

    def _run_frame(self) -> None:
        """One control step: collisions once, then `substeps` solver steps (an even number, so the
        result lands in `self._state` again, as a captured graph needs)."""
        dt = self.frame_dt / self.substeps
        if self._pipeline is not None:
            self._pipeline.collide(self._state, self._contacts)
        for _ in range(self.substeps):
            self._state.clear_forces()
            self._solver.step(self._state, self._next, self._control, self._contacts, dt)
            self._state, self._next = self._next, self._state

    def _reset(self, *, seed: int | None) -> dict[str, np.ndarray]:
        if seed is not None:
            self._noise = ResetNoise(seed)
        self._q, self._qd = self._initial(self._noise.draws(np.arange(self.num_envs)))
        self._t[:] = 0
        self._write(None)
        return {"observation": self._observe(self._q, self._qd)}

    def _step(self, actions: dict[str, np.ndarray]):
        action = actions["action"]
        self._forces[:, list(self.actuated)] = action * self.gear
        self._control.joint_f.assign(self._forces.ravel())
        q_before = self._q
        self._simulate()
        self._read()
        broken = ~(np.isfinite(self._q).all(axis=1) & np.isfinite(self._qd).all(axis=1))
        if broken.any():
            self._q[broken] = np.nan_to_num(self._q[broken], posinf=0.0, neginf=0.0)
            self._qd[broken] = np.nan_to_num(self._qd[broken], posinf=0.0, neginf=0.0)
        reward, terminated = self._reward(q_before, self._q, self._qd, action)
        terminated = terminated | broken
        reward = np.where(broken, 0.0, reward)
        self._t += 1
        truncated = (self._t >= self.max_episode_steps) & ~terminated
        observation = self._observe(self._q, self._qd)
        done = terminated | truncated
        final = observation
        if done.any():
            rows = np.flatnonzero(done)
            self._q[rows], self._qd[rows] = self._initial(self._noise.draws(rows))
            self._t[rows] = 0
            self._write(rows)
            observation = observation.copy()
            observation[rows] = self._observe(self._q[rows], self._qd[rows])
        return ({"observation": observation}, reward, terminated, truncated, {"observation": final})

    def close(self) -> None:
        super().close()
        if not self._closed:
            self._closed = True
            self._solver = self._state = self._next = self._control = self._model = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_envs={self.num_envs}, device={self.device!r})"


def _asset(name: str) -> str:
    import newton.examples

    return newton.examples.get_asset(name)


class NewtonCartpole(NewtonTask):
    """Keep a pole upright on a cart by pushing the cart: `cartpole.urdf` with its second pole left
    out (one pole, as Isaac Lab's and Gymnasium's cartpole; `NewtonDoubleCartpole` keeps both).

    Observation (2 + 2 `poles`: (4,) here, (6,) for the double): cart position, the pole angles
    (each relative to the link below it), and their velocities. Action (1,) in [-1, 1]: the cart
    force, times `gear` (20 N). Reward: 1 per step alive minus the squared absolute pole angles and
    small velocity costs; -2 on termination. Terminated when the cart leaves [-3, 3] m or any pole
    leans over `max_angle` (45 deg); truncated after `max_episode_steps` (500, 8.3 s at 60 Hz).
    The cart is 1 kg, each pole 0.25 kg with its centre of mass 0.47 m up and 0.1 kg m^2 about it;
    every joint has armature 0.1.
    """

    task = "cartpole"
    solver = "featherstone"
    substeps = 2  # 120 Hz physics under 60 Hz control, as Isaac Lab's cartpole
    actuated = (0,)
    gear = 20.0
    poles = 1
    max_cart = 3.0
    max_angle = math.pi / 4

    def __init__(self, *, num_envs: int, seed: int | None = None, max_episode_steps: int | None = None,
                 device: str | None = None, capture: bool = True):
        width = 2 * (1 + self.poles)
        super().__init__(num_envs=num_envs, seed=seed, max_episode_steps=max_episode_steps, device=device,
                         capture=capture,
                         observation_spec=(Spec("observation", np.float32, (width,)),),
                         action_spec=(Spec("action", np.float32, (1,), low=(-1.0,), high=(1.0,)),))

    def _urdf(self) -> str:
        """The shipped asset without pole2 and its joint (XML content for `add_urdf`)."""
        import xml.etree.ElementTree as ET

        robot = ET.parse(_asset("cartpole.urdf")).getroot()
        for tag, name in (("link", "pole2"), ("joint", "pole1_to_pole2")):
            robot.remove(robot.find(f"{tag}[@name='{name}']"))
        return ET.tostring(robot, encoding="unicode")

    def _build(self, builder: Any) -> None:
        import newton

        builder.default_joint_cfg.armature = 0.1
        builder.add_urdf(self._urdf(), floating=False, enable_self_collisions=False, collapse_fixed_joints=True)
        for shape in range(builder.shape_count):
            builder.shape_flags[shape] &= ~newton.ShapeFlags.COLLIDE_SHAPES

    def _initial(self, noise: Callable[..., np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        q = noise(-0.1, 0.1, 1 + self.poles)
        qd = noise(-0.05, 0.05, 1 + self.poles)
        return q, qd

    def _observe(self, q: np.ndarray, qd: np.ndarray) -> np.ndarray:
        return np.concatenate([q, qd], axis=1).astype(np.float32)

    def _reward(self, q_before, q, qd, action):
        poles = np.cumsum(q[:, 1:], axis=1)  # absolute angles from the relative joint angles
        terminated = (np.abs(q[:, 0]) > self.max_cart) | (np.abs(poles) > self.max_angle).any(axis=1)
        reward = 1.0 - np.square(poles).sum(axis=1) - 0.01 * np.abs(qd[:, 0]) - 0.005 * np.abs(qd[:, 1:]).sum(axis=1)
        return np.where(terminated, -2.0, reward), terminated


class NewtonDoubleCartpole(NewtonCartpole):
    """`cartpole.urdf` as shipped: two poles in series on the cart (see `NewtonCartpole`), observation (6,).

    Balanceable from part of its reset states, and not learned in minutes: the best of 162 LQR
    controllers held 66% of 32 reset states for 500 steps at 20 N (94% at 100 N); PPO stays near the
    ~100-step episodes of a zero action (docs/simulators.md, "Why the double stalls near 100").
    """

    task = "double_cartpole"
    poles = 2

    def _urdf(self) -> str:
        return _asset("cartpole.urdf")


class NewtonAnt(NewtonTask):
    """`nv_ant.xml`: the four-legged ant on a ground plane, running along +x.

    Observation (27,): torso height, torso orientation (quaternion x, y, z, w), the 8 hinge
    angles, the torso's linear and angular velocity, the 8 hinge velocities (Gymnasium Ant's
    layout without the x, y position and contact forces). Action (8,) in [-1, 1]: hinge torques
    times `gear` (7.5 N m, as Isaac Lab's ant), ordered hip_1, ankle_1, hip_2, ankle_2, ..., hip_4, ankle_4.
    Reward: forward velocity + 1 while healthy - 0.5 |action|^2. Terminated when the torso drops
    below `min_height` (0.31 m, Isaac Lab's ant) or rises above 1.5 m; truncated after
    `max_episode_steps` (1000).
    """

    task = "ant"
    solver = "xpbd"
    substeps = 4  # 240 Hz: XPBD contacts want the smaller step
    ground = True
    default_max_episode_steps = 1000
    actuated = tuple(range(6, 14))
    gear = 7.5  # Isaac Lab's ant: the XML's gear 15 times its action scale 0.5
    min_height = 0.31
    max_height = 1.5
    _pose = np.array([0.0, 0.0, 0.75, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, -1.0, 0.0, -1.0, 0.0, 1.0], np.float32)

    def __init__(self, *, num_envs: int, seed: int | None = None, max_episode_steps: int | None = None,
                 device: str | None = None, capture: bool = True):
        super().__init__(num_envs=num_envs, seed=seed, max_episode_steps=max_episode_steps, device=device,
                         capture=capture,
                         observation_spec=(Spec("observation", np.float32, (27,)),),
                         action_spec=(Spec("action", np.float32, (8,), low=(-1.0,), high=(1.0,)),))

    def _build(self, builder: Any) -> None:
        import warp as wp

        builder.default_shape_cfg.mu = 1.0
        builder.add_mjcf(_asset("nv_ant.xml"), ignore_names=["floor", "ground"], enable_self_collisions=False)
        for body in range(builder.body_count):  # extra rotational inertia keeps XPBD stable at 240 Hz
            inertia = np.asarray(builder.body_inertia[body], np.float32).reshape(3, 3) + 0.01 * np.eye(3)
            builder.body_inertia[body] = wp.mat33(inertia.astype(np.float32))

    def _initial(self, noise: Callable[..., np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        hinges = noise(-0.1, 0.1, 8)
        q = np.tile(self._pose, (len(hinges), 1))
        q[:, 7:] += hinges
        qd = noise(-0.1, 0.1, 14)
        return q, qd

    def _observe(self, q: np.ndarray, qd: np.ndarray) -> np.ndarray:
        return np.concatenate([q[:, 2:], qd], axis=1).astype(np.float32)

    def _reward(self, q_before, q, qd, action):
        forward = (q[:, 0] - q_before[:, 0]) / self.frame_dt
        height = q[:, 2]
        terminated = (height < self.min_height) | (height > self.max_height)
        reward = forward + 1.0 - 0.5 * np.square(action).sum(axis=1)
        return reward, terminated


TASKS: dict[str, Callable[..., NewtonTask]] = {"cartpole": NewtonCartpole, "double_cartpole": NewtonDoubleCartpole,
                                                "ant": NewtonAnt}


def make_newton_task(task: str, *, num_envs: int, **kw: Any) -> NewtonTask:
    """A Newton task by name ("cartpole", "double_cartpole", "ant"); keyword arguments go to its constructor."""
    if task not in TASKS:
        raise ValueError(f"unknown Newton task {task!r}: the tasks are {sorted(TASKS)}")
    return TASKS[task](num_envs=num_envs, **kw)
