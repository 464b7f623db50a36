"""MuJoCo cameras as observation tensors: `with_cameras(env, names)` adds one uint8 (H, W, 3) RGB image per named
camera to an env's observations, rendered offscreen on the CPU (EGL through Mesa: `MUJOCO_GL=egl`, set here unless
the caller chose another backend before MuJoCo was imported). Shadows, reflections and anti-aliasing are off. The
images travel JPEG-encoded (`sim.env.observation_encoder`; the gateway decodes them into the policy's uint8 batch).

    >>> import numpy as np
    >>> from sim.mujoco import make_env
    >>> env = with_cameras(make_env("CameraReach", seed=0), ["top", "front"], size=32)
    >>> [(s.name, s.dtype.name, s.shape, s.encoding) for s in env.observation_spec()]   # 1: JPEG on the wire
    [('observation', 'float32', (4,), 0), ('top', 'uint8', (32, 32, 3), 1), ('front', 'uint8', (32, 32, 3), 1)]
    >>> ts = env.reset()
    >>> ts.observation["top"].shape, int(ts.observation["top"].max()) > 0
    ((32, 32, 3), True)
    >>> with_cameras(make_env("CameraReach"), ["wrist"])
    Traceback (most recent call last):
    ...
    ValueError: camera 'wrist' is not in the MuJoCo model; its cameras are ['top', 'front']
    >>> env.close()

From the command line: `tether sim --env CameraReach --camera top --camera front --image-size 224`.
Any env with a MuJoCo model works (`physics`: a gymnasium `*-v5` env, `CameraReach`); a camera index (`-1`: MuJoCo's
free camera) is refused: cameras are named.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence

os.environ.setdefault("MUJOCO_GL", "egl")  # before MuJoCo is imported: its GL backend is chosen at import

import numpy as np

from protos.codec import IMAGE_FORMATS, RAW, Spec
from sim.env import Environment, TimeStep

__all__ = ["CameraEnv", "CameraRenderer", "DEFAULT_SIZE", "physics", "with_cameras"]

DEFAULT_SIZE = 224


def physics(env: Environment):
    """The (mujoco.MjModel, mujoco.MjData) an env steps; ValueError when it has none (not a MuJoCo env)."""
    found = getattr(env, "physics", None)
    if found is None:
        raise ValueError(f"{env!r} has no MuJoCo model to render: cameras need a MuJoCo env "
                         "(a gymnasium *-v5 id or CameraReach)")
    return found


class CameraRenderer:
    """Renders named cameras of one MuJoCo model into uint8 (height, width, 3) arrays, one GL context per renderer.

    `render(data)` -> {camera name: image}; the arrays are new each call (safe to keep).
    """

    def __init__(self, model, cameras: Sequence[str], *, height: int = DEFAULT_SIZE, width: int = DEFAULT_SIZE):
        import mujoco

        cameras = list(cameras)
        if not cameras:
            raise ValueError("no camera named: give at least one camera name")
        if len(set(cameras)) != len(cameras):
            raise ValueError(f"cameras {cameras} name one camera twice")
        for side, value in (("height", height), ("width", width)):
            if isinstance(value, bool) or not isinstance(value, int) or not 8 <= value <= 4096:
                raise ValueError(f"image {side} must be an integer in [8, 4096], got {value!r}")
        known = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]
        for name in cameras:
            if not isinstance(name, str) or name not in known:
                raise ValueError(f"camera {name!r} is not in the MuJoCo model; its cameras are {known}")
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)
        model.vis.global_.offheight = max(model.vis.global_.offheight, height)
        model.vis.quality.offsamples = 0  # no multisample anti-aliasing
        self.cameras, self.height, self.width = tuple(cameras), height, width
        self.frames, self.render_ns = 0, 0  # images rendered, and the time it took (`render_ms_per_frame`)
        try:
            self._renderer = mujoco.Renderer(model, height, width)
        except Exception as exc:  # no GL backend: glfw without a display, EGL without Mesa's libEGL
            raise RuntimeError(f"cannot render offscreen with MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}: {exc}; "
                               "MUJOCO_GL=egl (Mesa's libEGL, installed by `make setup`) must be set before "
                               "MuJoCo is imported") from exc
        for flag in (mujoco.mjtRndFlag.mjRND_SHADOW, mujoco.mjtRndFlag.mjRND_REFLECTION,
                     mujoco.mjtRndFlag.mjRND_SKYBOX):
            self._renderer.scene.flags[flag] = False

    def specs(self, *, encoding: str = "raw") -> tuple[Spec, ...]:
        """One uint8 (height, width, 3) spec per camera, declaring how it travels: "jpeg", "png" or "raw"."""
        if encoding != "raw" and encoding not in IMAGE_FORMATS:
            raise ValueError(f"image encoding {encoding!r} must be one of {['raw', *sorted(IMAGE_FORMATS)]}")
        code = RAW if encoding == "raw" else IMAGE_FORMATS[encoding]
        return tuple(Spec(name, np.uint8, (self.height, self.width, 3), encoding=code) for name in self.cameras)

    def render(self, data) -> dict[str, np.ndarray]:
        images, start = {}, time.perf_counter_ns()
        for name in self.cameras:
            self._renderer.update_scene(data, camera=name)
            images[name] = self._renderer.render()
        self.render_ns += time.perf_counter_ns() - start
        self.frames += len(self.cameras)
        return images

    def render_ms_per_frame(self) -> float | None:
        return self.render_ns / 1e6 / self.frames if self.frames else None

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


class CameraEnv:
    """An `Environment` whose observations are `env`'s plus one image per camera (rendered after each reset and
    step). Everything else (actions, rewards, episode ends, `source`) is `env`'s."""

    def __init__(self, env: Environment, cameras: Sequence[str], *, height: int = DEFAULT_SIZE,
                 width: int = DEFAULT_SIZE, encoding: str = "jpeg"):
        taken = {s.name for s in env.observation_spec()} & set(cameras)
        if taken:
            raise ValueError(f"camera(s) {sorted(taken)} would replace {env!r}'s observation tensor of that name")
        model, self._data = physics(env)
        self.env = env
        self.renderer = CameraRenderer(model, cameras, height=height, width=width)
        try:
            self._spec = (*env.observation_spec(), *self.renderer.specs(encoding=encoding))
        except ValueError:
            self.renderer.close()
            raise
        self.source = getattr(env, "source", f"sim:{type(env).__name__}")

    def observation_spec(self) -> tuple[Spec, ...]:
        return self._spec

    def action_spec(self) -> tuple[Spec, ...]:
        return self.env.action_spec()

    def _with_images(self, ts: TimeStep) -> TimeStep:
        return dataclasses.replace(ts, observation={**ts.observation, **self.renderer.render(self._data)})

    def reset(self, *, seed: int | None = None) -> TimeStep:
        return self._with_images(self.env.reset(seed=seed))

    def step(self, action: Mapping[str, np.ndarray]) -> TimeStep:
        return self._with_images(self.env.step(action))

    @property
    def physics(self):
        return physics(self.env)

    def close(self) -> None:
        self.renderer.close()
        self.env.close()

    def __repr__(self) -> str:
        return f"CameraEnv({self.env!r}, {list(self.renderer.cameras)}, {self.renderer.height}x{self.renderer.width})"


def with_cameras(env: Environment, cameras: Sequence[str], *, size: int | tuple[int, int] = DEFAULT_SIZE,
                 encoding: str = "jpeg") -> CameraEnv:
    """`env` with an image of each camera in its observations; `size`: N (square) or (height, width); `encoding`:
    how the images travel to the gateway ("jpeg" by default, "png", "raw"; the env itself returns arrays). `env` is
    closed when the cameras cannot be made (ValueError naming the camera, size, encoding or env)."""
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    try:
        return CameraEnv(env, cameras, height=height, width=width, encoding=encoding)
    except Exception:
        env.close()
        raise
