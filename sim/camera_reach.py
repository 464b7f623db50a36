"""`CameraReach`: a MuJoCo reach task whose goal is visible only in camera images.

A blue fingertip slides on a table (two slide joints, velocity-controlled); a red disk marks a goal placed at random
each episode. The state observation is the fingertip's position and velocity only, so a policy must find the goal
in the images of the `top` (straight down) or `front` (oblique) camera (`sim.cameras.with_cameras`). Reward: minus
the distance to the goal; an episode is truncated after `max_episode_steps` (default 50) steps of 0.05 s.

    >>> import numpy as np
    >>> from sim.cameras import with_cameras
    >>> env = with_cameras(CameraReach(seed=0), ["top"], size=64)
    >>> ts = env.reset()
    >>> while not ts.last():
    ...     ts = env.step(expert_action(ts.observation))      # sees the goal in the top image only
    >>> bool(env.env.distance() < SUCCESS_M), ts.observation["observation"].shape
    (True, (4,))
    >>> env.close()

`expert_action(observation)` is the scripted demonstrator: it finds the red disk's centroid in the `top` image, maps
it to table coordinates through the camera's pinhole model, and drives the fingertip there (what BC learns from).
"""

from __future__ import annotations

import math

import numpy as np

from protos.codec import Spec
from sim.env import BaseEnvironment

__all__ = ["SUCCESS_M", "CameraReach", "expert_action"]

SUCCESS_M = 0.03       # a fingertip this close to the goal has reached it
SPEED = 0.4            # m/s at |action| = 1
GOAL_RANGE = 0.2       # the goal's x and y are uniform in [-GOAL_RANGE, GOAL_RANGE]
TOP_HEIGHT = 0.9       # the top camera's height over the table (it looks straight down)
TOP_FOVY = 45.0        # its vertical field of view, degrees
GAIN = 6.0             # the expert's velocity per metre of error (1/s)

XML = f"""
<mujoco model="camera_reach">
  <option timestep="0.01"/>
  <visual>
    <quality shadowsize="0" offsamples="0"/>
    <headlight ambient="0.4 0.4 0.4" diffuse="0.3 0.3 0.3" specular="0 0 0"/>
  </visual>
  <worldbody>
    <light pos="0 0 1.5" dir="0 0 -1" directional="true" castshadow="false" diffuse="0.3 0.3 0.3" specular="0 0 0"/>
    <geom name="table" type="plane" size="0.5 0.5 0.01" rgba="0.6 0.6 0.6 1"/>
    <body name="goal" mocap="true" pos="0 0 0.001">
      <geom name="goal" type="cylinder" size="0.04 0.001" rgba="0.9 0.1 0.1 1" contype="0" conaffinity="0"/>
    </body>
    <body name="finger" pos="0 0 0.03">
      <joint name="x" type="slide" axis="1 0 0" range="-0.3 0.3"/>
      <joint name="y" type="slide" axis="0 1 0" range="-0.3 0.3"/>
      <geom name="finger" type="sphere" size="0.025" mass="0.1" rgba="0.1 0.3 0.9 1" contype="0" conaffinity="0"/>
    </body>
    <camera name="top" pos="0 0 {TOP_HEIGHT}" xyaxes="1 0 0 0 1 0" fovy="{TOP_FOVY}"/>
    <camera name="front" pos="0 -0.75 0.55" xyaxes="1 0 0 0 0.6 0.8" fovy="50"/>
  </worldbody>
  <actuator>
    <velocity name="vx" joint="x" kv="4" ctrlrange="-{SPEED} {SPEED}"/>
    <velocity name="vy" joint="y" kv="4" ctrlrange="-{SPEED} {SPEED}"/>
  </actuator>
</mujoco>
"""


class CameraReach(BaseEnvironment):
    """Observation {"observation": [x, y, vx, vy] float32}; action {"action": [vx, vy] float32 in [-1, 1]} (times
    `SPEED` m/s). `physics` is the (model, data) the cameras render."""

    source = "mujoco:CameraReach"
    SUBSTEPS = 5

    def __init__(self, *, seed: int | None = None, max_episode_steps: int | None = 50):
        import mujoco

        super().__init__(observation_spec=(Spec("observation", np.float32, (4,)),),
                         action_spec=(Spec("action", np.float32, (2,), low=(-1.0,), high=(1.0,)),))
        if max_episode_steps is not None and max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        self._max_steps = max_episode_steps
        self._rng = np.random.default_rng(seed)
        self.model = mujoco.MjModel.from_xml_string(XML)
        self.data = mujoco.MjData(self.model)
        self._t = 0

    @property
    def physics(self):
        return self.model, self.data

    def goal(self) -> np.ndarray:
        return self.data.mocap_pos[0, :2].copy()

    def distance(self) -> float:
        return float(np.linalg.norm(self.data.qpos[:2] - self.goal()))

    def _observe(self) -> dict[str, np.ndarray]:
        return {"observation": np.concatenate([self.data.qpos[:2], self.data.qvel[:2]]).astype(np.float32)}

    def _reset(self, *, seed: int | None) -> dict[str, np.ndarray]:
        import mujoco

        if seed is not None:
            self._rng = np.random.default_rng(seed)
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[:2] = self._rng.uniform(-0.15, 0.15, 2)
        self.data.mocap_pos[0, :2] = self._rng.uniform(-GOAL_RANGE, GOAL_RANGE, 2)
        mujoco.mj_forward(self.model, self.data)
        self._t = 0
        return self._observe()

    def _step(self, action: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float, bool, bool]:
        import mujoco

        self.data.ctrl[:] = SPEED * action["action"].astype(np.float64)
        mujoco.mj_step(self.model, self.data, nstep=self.SUBSTEPS)
        self._t += 1
        truncated = self._max_steps is not None and self._t >= self._max_steps
        return self._observe(), -self.distance(), False, truncated

    def close(self) -> None:
        super().close()

    def __repr__(self) -> str:
        return "CameraReach()"


def goal_in_top_image(image: np.ndarray) -> np.ndarray | None:
    """The goal's (x, y) on the table from the `top` camera's image (the red disk's centroid through the pinhole
    model), or None when no red pixel shows."""
    height, width = image.shape[:2]
    pixels = image.astype(np.int16)
    red = (pixels[..., 0] > 150) & (pixels[..., 1] < 90) & (pixels[..., 2] < 90)
    if not red.any():
        return None
    rows, cols = np.nonzero(red)
    metres_per_pixel = 2 * TOP_HEIGHT * math.tan(math.radians(TOP_FOVY) / 2) / height
    x = (cols.mean() + 0.5 - width / 2) * metres_per_pixel
    y = (height / 2 - rows.mean() - 0.5) * metres_per_pixel
    return np.array([x, y])


def expert_action(observation: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The scripted demonstrator: towards the goal it sees in `observation["top"]`, at most `SPEED`; zero when it
    sees none. KeyError naming `top` when the observation has no top image."""
    if "top" not in observation:
        raise KeyError(f"the expert needs the 'top' camera's image; the observation has {sorted(observation)}")
    goal = goal_in_top_image(observation["top"])
    if goal is None:
        return {"action": np.zeros(2, np.float32)}
    error = goal - observation["observation"][:2]
    return {"action": np.clip(GAIN * error / SPEED, -1.0, 1.0).astype(np.float32)}
