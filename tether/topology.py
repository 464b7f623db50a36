"""The one place that wires the demo topology: which processes, which addresses, in which order.

    Triton (subprocess) ◀── gateway (subprocess `tether gateway`) ◀── M vectorised sessions of N envs
                                                                       (MuJoCo or Newton, this process)

and with `train=True` the learning loop around it, learning from N single-env MuJoCo sessions, or, for a
vector env (`newton:cartpole`) or with `sessions` given, from M vectorised sessions of N envs (each env's
transitions are logged as `<session>/<i>`: per-env trajectories; vectorised sessions replay after a
reconnect like single-env ones):

    gateway ── experience log (run_dir/experience) ──▶ trainer (subprocess `tether train --algo ppo|sac`)
       ▲                                                   │
       └──────────── Policies.Publish (new versions) ◀─────┘

With `camera=True` (`tether demo --camera`) the sims are CameraReach robots with two rendered 224x224 cameras
(JPEG to the gateway, decoded there into the policy's uint8 batch) and the policy a fresh image + state -> chunk
policy (trainer.camera_policy, H = `horizon`), its chunks executed tick by tick (sim.chunked).

Every piece also runs alone: `tether triton`, `tether gateway`, `tether sim`, `tether train`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import sim
from bridge.client.chunks import ChunkConfig
from bridge.common import files as common_files
from bridge.common.processes import Child, NotReady, free_port, spawn, stop_group, wait_ready
from inference_server import ModelRepository, TritonServer
from sim.client import check_rate, run_sessions, run_vector_sessions
from tether.initial_policy import write_camera_policy, write_initial_policy
from tether.stack import gateway_process


def is_vector_env(env_id: str) -> bool:
    """`newton:cartpole`, `isaaclab:...`, `mujoco:Hopper-v5`: a name only the vector env factory knows."""
    return sim.is_vector(env_id)


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    env: str = "Hopper-v5"
    envs: int = 8                    # envs per vectorised session (with `train`: single-env sessions, see `vector`)
    sessions: int | None = None      # vectorised sessions (default 1; with `train`, given: vectorised sessions)
    seconds: float = 10.0
    summary: Path | None = None
    run_dir: Path | None = None
    train: bool = False              # the learning loop: experience log + a PPO trainer publishing versions
    trainer_nproc: int = 2
    seed: int = 0
    stop_at_return: float | None = None  # end early once the mean return of the last 20 episodes reaches it
    serve: str | None = None         # the policy's runtime in Triton (write_initial_policy's default when None)
    algo: str = "ppo"                # with `train`: "ppo" (torchrun, trainer_nproc ranks) or "sac" (one rank)
    trainer_args: tuple[str, ...] = ()  # more `tether train` flags, e.g. ("--seed-log", DIR, "--utd", "2")
    rate_hz: float | None = None     # a fixed control rate: each session steps at most this often (`tether sim --rate`)
    persistent_versions: bool | None = None  # with `train`: ONNX versions served by one persistent Triton model
    #                                          (gateway --persistent-versions); None: on when the policy is ONNX
    camera: bool = False             # CameraReach, top and front cameras, a camera chunk policy (single-env sessions)
    horizon: int = 16                # with `camera`: the policy's chunk of H actions
    image_size: int = 224            # with `camera`: square images of this many pixels a side
    view: bool = False               # `tether view` beside the gateway: the robots live in Foxglove

    def __post_init__(self):
        if self.envs < 1:
            raise ValueError(f"--envs must be at least 1, got {self.envs}")
        if self.sessions is not None and self.sessions < 1:
            raise ValueError(f"--sessions must be at least 1, got {self.sessions}")
        if self.seconds <= 0:
            raise ValueError(f"--seconds must be positive, got {self.seconds}")
        if self.trainer_nproc < 1:
            raise ValueError(f"--trainer-nproc must be at least 1, got {self.trainer_nproc}")
        if self.algo not in ("ppo", "sac"):
            raise ValueError(f"--algo must be ppo or sac, got {self.algo!r}")
        check_rate(self.rate_hz)
        if isinstance(self.horizon, bool) or not isinstance(self.horizon, int) or not 1 <= self.horizon <= 10_000:
            raise ValueError(f"--horizon must be an integer in [1, 10000], got {self.horizon!r}")
        if isinstance(self.image_size, bool) or not isinstance(self.image_size, int) or \
                not 8 <= self.image_size <= 4096:
            raise ValueError(f"--image-size must be an integer in [8, 4096], got {self.image_size!r}")
        if self.camera and (self.train or is_vector_env(self.env) or self.sessions is not None):
            raise ValueError("--camera runs single-env camera sessions: not with --train, --sessions or a vector --env "
                             "(the camera policy learns by BC from logged demonstrations: docs/learning.md)")

    @property
    def vector(self) -> bool:
        """Vectorised sessions: always without `train`; with it, for a vector env or with `sessions` given."""
        return not self.camera and (not self.train or self.sessions is not None or is_vector_env(self.env))


class _Progress:
    """Prints the status line each tick and keeps the learning curve: (seconds, env steps, mean
    return of the last 20 episodes, newest acting version)."""

    def __init__(self):
        self.curve: list[dict] = []

    def __call__(self, stats) -> None:
        print(f"  {stats.status_line()}", flush=True)
        self.curve.append({"seconds": round(stats.elapsed_s, 2), "steps": stats.steps,
                           "return": None if stats.recent_return() is None else round(stats.recent_return(), 2),
                           "version": stats.newest_version})


def _reached(target: float | None):
    if target is None:
        return None
    return lambda stats: (stats.recent_return() or float("-inf")) >= target


@contextlib.contextmanager
def trainer_process(*, gateway: str, policy: str, run_dir: Path, nproc: int, seed: int, seconds: float,
                    extra_args: tuple[str, ...] = (), ready_timeout: float = 180.0,
                    algo: str = "ppo") -> Iterator[subprocess.Popen]:
    """`tether train --algo ppo|sac` against the gateway, its output in run_dir/trainer.log; yields once
    the trainer has fetched the policy and reads the stream (its ranks are up: under load, starting
    torchrun and its ranks takes tens of seconds, which the sims would otherwise spend acting with v1)."""
    log_path = run_dir / "trainer.log"
    log = open(log_path, "a")  # noqa: SIM115 - closed below, after the process
    start = log.tell()
    cmd = [sys.executable, "-m", "tether", "train", "--gateway", gateway, "--algo", algo, "--policy", policy,
           "--nproc", str(nproc), "--seed", str(seed), "--checkpoint-dir", str(run_dir / "checkpoints"),
           "--seconds", str(seconds), "--summary", str(run_dir / "trainer.json"), *extra_args]
    proc = spawn(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            wait_ready(proc, lambda: f"[trainer] {algo}:" in log_path.read_text()[start:], timeout=ready_timeout,
                       what="trainer", period=0.2)
        except NotReady as exc:
            raise RuntimeError(f"{exc}; see {log_path}:\n" + log_path.read_text()[start:][-2000:]) from None
        yield proc
    finally:
        stop_group(proc)
        log.close()


@contextlib.contextmanager
def view_process(gateway: str, log_path: Path, *args: str) -> Iterator[dict]:
    """`tether view --gateway G --port 0 ARGS...` (bridge.view), its stderr in `log_path`; yields its start line
    (JSON: `url`, `stats`, `layout`) once it serves, and stops it after."""
    child = Child([sys.executable, "-m", "tether", "view", "--gateway", gateway, "--port", "0", *args], log_path,
                  name="tether view", ready="{")
    with child:
        yield json.loads("{" + child.ready_value)


def run_demo(config: DemoConfig) -> dict:
    """Triton + gateway + N MuJoCo sessions for `config.seconds` (plus a trainer with `train`);
    returns the summary dict."""
    run_dir = config.run_dir or Path(tempfile.mkdtemp(prefix="tether-demo-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    repo = ModelRepository(run_dir / "models")
    cameras: list = []  # with `camera`: each session's env (their render times)
    if config.camera:
        cameras.append(camera_env(config, config.seed))
        name = write_camera_policy(repo, cameras[0], horizon=config.horizon, seed=config.seed,
                                   serve=config.serve or "torchscript")
        kind = f"CNN per camera + MLP head -> {config.horizon}-action chunks"
    else:
        name = write_initial_policy(repo, config.env, seed=config.seed, stochastic=config.train, serve=config.serve)
        kind = "Gaussian policy, sampled in Triton" if config.train else "MLP"
    print(f"run dir {run_dir}\npolicy  {name} v{repo.versions(name)[-1]} (freshly initialised {kind})", flush=True)
    # every step logged in the run dir: `tether log export RUN_DIR OUT --format lerobot|foxglove` afterwards
    gateway_args: tuple[str, ...] = ("--experience-dir", str(run_dir / "experience"))
    models = [name]
    if config.train:
        # sessions act with each new version from their next step: a good pendulum's episodes last
        # 1000 steps, and waiting for an episode's end would leave PPO learning from far-behind versions
        gateway_args += ("--model-repository", str(repo.root), "--switch", "step")
        shared = repo.supports_versions_model(name)  # served by onnxruntime: one model can serve every version
        if config.persistent_versions or (config.persistent_versions is None and shared):
            # every version from one persistent model: no Triton stub started per version (docs/versions.md)
            models = [repo.write_versions_model(name)]
            gateway_args += ("--persistent-versions",)
    console_port = free_port()  # the operator console (and /metrics) on loopback: open it while the demo runs
    gateway_args += ("--console-port", str(console_port))
    t0 = time.monotonic()
    with TritonServer(repo.root, models=models, log_path=run_dir / "triton.log") as triton:
        print(f"triton  {triton.version} on {triton.grpc_url} (ready in {time.monotonic() - t0:.1f} s)")
        with contextlib.ExitStack() as stack:
            gw = stack.enter_context(gateway_process(triton_url=triton.grpc_url, policy=name,
                                                     log_path=run_dir / "gateway.log", extra_args=gateway_args))
            print(f"gateway {gw}\nconsole http://127.0.0.1:{console_port}/ (metrics at /metrics)", flush=True)
            if config.view:
                view = stack.enter_context(view_process(gw, run_dir / "view.log"))
                print(f"view    {view['url']} (Foxglove: Open connection; layout {view['layout']})", flush=True)
            if config.train:
                nproc = 1 if config.algo == "sac" else config.trainer_nproc
                stack.enter_context(trainer_process(gateway=gw, policy=name, run_dir=run_dir, nproc=nproc,
                                                    seed=config.seed, seconds=config.seconds + 30,
                                                    algo=config.algo, extra_args=config.trainer_args))
                print(f"trainer {config.algo.upper()}, {nproc} rank(s) (torchrun), log {run_dir / 'trainer.log'}")
            progress = _Progress()
            if config.camera:
                print(f"sim     {config.envs} x {config.env} with cameras {list(cameras[0].renderer.cameras)} "
                      f"({config.image_size}x{config.image_size} RGB, JPEG) for {config.seconds:g} s, chunks of "
                      f"{config.horizon}", flush=True)
                cameras.extend(camera_env(config, config.seed + i) for i in range(1, config.envs))
                stats = asyncio.run(run_sessions(gw, cameras.__getitem__, envs=config.envs, seconds=config.seconds,
                                                 on_progress=progress, chunks=ChunkConfig(horizon=config.horizon),
                                                 rate_hz=config.rate_hz))
            elif not config.vector:
                print(f"sim     {config.envs} x {config.env} for {config.seconds:g} s", flush=True)
                stats = asyncio.run(run_sessions(gw, lambda i: sim.make(config.env, seed=config.seed + i),
                                                 envs=config.envs, seconds=config.seconds, on_progress=progress,
                                                 reconnect_s=10.0, until=_reached(config.stop_at_return),
                                                 rate_hz=config.rate_hz))
            else:
                sessions = config.sessions or 1
                print(f"sim     {sessions} vectorised session(s) x {config.envs} envs of {config.env} "
                      f"for {config.seconds:g} s", flush=True)
                stats = asyncio.run(run_vector_sessions(
                    gw, lambda i: sim.make(config.env, num_envs=config.envs, seed=config.seed + i * config.envs),
                    sessions=sessions, seconds=config.seconds, on_progress=progress,
                    reconnect_s=10.0 if config.train else 0.0, until=_reached(config.stop_at_return),
                    rate_hz=config.rate_hz))
        summary = stats.summary()
        summary["envs_per_session"] = config.envs if config.vector else 1
        if config.camera:
            frames = sum(env.renderer.frames for env in cameras)
            summary["camera"] = {"cameras": list(cameras[0].renderer.cameras), "image_size": config.image_size,
                                 "horizon": config.horizon, "frames": frames,
                                 "render_ms_per_frame": round(sum(env.renderer.render_ns for env in cameras)
                                                              / 1e6 / max(frames, 1), 3),
                                 "chunks": len(stats.rtt_ns)}
        summary["triton_version"] = triton.version
        if config.train:
            reached = next((p for p in progress.curve if p["return"] is not None and p["return"] >= 500.0), None)
            summary["curve"] = progress.curve
            summary["seconds_to_500"] = None if reached is None else reached["seconds"]
            summary["steps_to_500"] = None if reached is None else reached["steps"]
    summary["error_codes"] = summary["errors"]
    summary["errors"] = sum(summary["error_codes"].values())
    print_table(summary)
    if config.summary:
        write_json(config.summary, summary)
    return summary


def camera_env(config: DemoConfig, seed: int):
    """`config.env` (CameraReach by default) with its top and front cameras rendered at `config.image_size`."""
    from sim.cameras import with_cameras

    return with_cameras(sim.make(config.env, seed=seed), ["top", "front"], size=config.image_size)


def print_table(summary: dict) -> None:
    rows = [("steps", f"{summary['steps']}"), ("steps/s", f"{summary['steps_per_s']:.0f}"),
            ("sessions", f"{summary['sessions']}"), ("round trip p50", f"{summary['rtt_ms']['p50']} ms"),
            ("round trip p99", f"{summary['rtt_ms']['p99']} ms"),
            ("triton version", summary["triton_version"]), ("errors", f"{summary['errors']}")]
    if "camera" in summary:
        camera = summary["camera"]
        rows += [("cameras", f"{', '.join(camera['cameras'])} ({camera['image_size']}x{camera['image_size']}, JPEG)"),
                 ("render per frame", f"{camera['render_ms_per_frame']} ms ({camera['frames']} frames)"),
                 ("chunks", f"{camera['chunks']} of {camera['horizon']} actions")]
    if "curve" in summary:
        rows += [("policy versions", ", ".join(f"v{v}: {n}" for v, n in summary["policy_versions"].items())),
                 ("return (last 20)", f"{summary['recent_return']}"),
                 ("return >= 500 after", "-" if summary["seconds_to_500"] is None
                  else f"{summary['seconds_to_500']} s, {summary['steps_to_500']} env steps")]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))


def write_json(path: Path, data: dict) -> None:
    """Atomically and durably: a reader never sees a half-written file (bridge.common.files)."""
    common_files.write_json(path, data)
