"""What the LeRobot tests share: a camera robot's experience log (`camera_log`), LeRobot's own environment run as a
subprocess (`lerobot_side`: tests/support/lerobot_side.py in .venv/lerobot, skipping when that is missing)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bridge.experience import ExperienceLog
from protos import bridge_pb2, codec, experience_pb2

ROOT = Path(__file__).resolve().parents[2]
SIDE_PYTHON = ROOT / ".venv" / "lerobot" / "bin" / "python"
SIDE_SCRIPT = ROOT / "tests" / "support" / "lerobot_side.py"
T0 = 1_764_720_000_000_000_000
PERIOD_NS = 33_333_333  # 30 Hz
LENGTHS = (20, 15, 25)  # terminated, truncated, still open at the log's end


def frame(step: int, phase: float, h: int = 48, w: int = 64) -> np.ndarray:
    """A smooth moving picture (sines drifting with the step), as a camera sees a scene, not noise."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 128 + 90 * np.sin(x / 9 + step * 0.15 + phase)
    g = 128 + 90 * np.cos(y / 7 - step * 0.1 + phase)
    b = 128 + 60 * np.sin((x + y) / 15 + step * 0.05)
    return np.stack([r, g, b], -1).clip(0, 255).astype(np.uint8)


def camera_transitions(lengths=LENGTHS, *, session: str = "s0", shape=(48, 64)) -> list[experience_pb2.Transition]:
    """One session of a robot at 30 Hz with two cameras ("front" JPEG-encoded as the edge sends it, "wrist" raw) and
    a 4-d state; episode e is acted by policy version 1 + e; in episode 1 a person acted at its steps 3 and 4
    (applied_action = the policy's + 100). Episode 0 terminates, 1 is truncated, the last is still open."""
    items = []
    for ep, n in enumerate(lengths):
        for k in range(n):
            step = sum(lengths[:ep]) + k
            state = np.array([np.sin(step / 10), np.cos(step / 7), step / 100, ep], np.float32)
            act = np.array([step % 5, -k], np.float32)
            t = experience_pb2.Transition(
                session=session, episode=ep, step=step, step_type=bridge_pb2.FIRST if k == 0 else bridge_pb2.MID,
                observation=[codec.encode("observation", state),
                             codec.encode_image("front", frame(step, 0.0, *shape), quality=95),
                             codec.encode("wrist", frame(step, 1.5, *shape))],
                action=[codec.encode("action", act)], reward=float(k), policy="pi", policy_version=1 + ep,
                timing=bridge_pb2.Timing(t_sent_ns=T0 + step * PERIOD_NS,
                                         gateway_recv_ns=T0 + step * PERIOD_NS + 400_000),
                source="mujoco:CameraReach-v0")
            if ep == 1 and k in (3, 4):
                t.intervention = True
                t.applied_action.append(codec.encode("action", act + 100))
            if k == n - 1 and ep < 2:
                t.terminated, t.truncated = ep == 0, ep == 1
            items.append(t)
    return items


def write_log(log_dir: Path, items: list[experience_pb2.Transition]) -> None:
    async def write():
        async with ExperienceLog(log_dir, fsync=False) as log:
            futures = [log.append(t) for t in items]
            await asyncio.gather(*(f for f in futures if f is not None))

    asyncio.run(write())


def camera_log(log_dir: Path, lengths=LENGTHS) -> list[experience_pb2.Transition]:
    items = camera_transitions(lengths)
    write_log(log_dir, items)
    return items


def lerobot_side(*args: str, timeout: float = 120) -> dict:
    """tests/support/lerobot_side.py ARGS in LeRobot's environment: its JSON. Skips when .venv/lerobot is missing."""
    if not SIDE_PYTHON.exists():
        pytest.skip(f"{SIDE_PYTHON} missing: LeRobot's environment is made best-effort by `make setup`")
    # without CAP_SYS_NICE: LeRobot's writer encodes with SVT-AV1, which as root would run its threads at SCHED_FIFO
    # 99 (bridge.experience.video) and starve the other test workers while it encodes; denied, it runs as others do
    no_real_time = ["setpriv", "--bounding-set=-sys_nice", "--inh-caps=-sys_nice"] if os.geteuid() == 0 else []
    run = subprocess.run([*no_real_time, str(SIDE_PYTHON), str(SIDE_SCRIPT), *args], capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout)
