"""The one place that wires the demo topology: which processes, which addresses, in which order.

    Triton (subprocess) ◀── gateway (subprocess `tether gateway`) ◀── N MuJoCo sims (this process)

Every piece also runs alone: `tether triton`, `tether gateway`, `tether sim`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from inference_server import ModelRepository, TritonServer
from sim.client import run_sessions
from sim.mujoco import make_env
from trainer.policy import MLPPolicy


def policy_name(env_id: str) -> str:
    """A Triton model name for an env's policy: `Hopper-v5` -> `hopper_v5`."""
    return re.sub(r"[^a-z0-9]+", "_", env_id.lower()).strip("_")


def write_initial_policy(repo: ModelRepository, env_id: str, *, seed: int = 0) -> str:
    """A freshly initialised MLP for `env_id`, written as version 1 of its model; returns the name."""
    env = make_env(env_id)
    try:
        observation, action = env.observation_spec(), env.action_spec()
    finally:
        env.close()
    name = policy_name(env_id)
    if not repo.versions(name):
        repo.write_version(name, 1, MLPPolicy(observation[0], action[0], seed=seed), observation, action)
    return name


@contextlib.contextmanager
def gateway_process(*, triton_url: str, policy: str, log_path: Path, timeout: float = 30.0,
                    extra_args: tuple[str, ...] = ()) -> Iterator[str]:
    """Start `tether gateway` on a free loopback port; yields its address, stops it on exit."""
    log = open(log_path, "w")  # noqa: SIM115 - closed below, after the process
    cmd = [sys.executable, "-m", "tether", "gateway", "--triton", triton_url, "--policy", policy, "--port", "0",
           *extra_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    address: list[str] = []
    ready = threading.Event()

    def pump() -> None:  # first line tells the address; the rest goes to the log
        for line in proc.stdout:
            if not address and line.startswith("gateway listening on "):
                address.append(line.split()[-1])
                ready.set()
            log.write(line)
        ready.set()

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    try:
        ready.wait(timeout)
        if not address:
            proc.kill()
            raise RuntimeError(f"gateway did not start within {timeout:g} s; see {log_path}:\n"
                               + log_path.read_text()[-2000:])
        yield address[0]
    finally:
        stop_process(proc)
        pumping.join(5)
        log.close()


def stop_process(proc: subprocess.Popen, *, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; returns once the process is gone."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    env: str = "Hopper-v5"
    envs: int = 8
    seconds: float = 10.0
    summary: Path | None = None
    run_dir: Path | None = None

    def __post_init__(self):
        if self.envs < 1:
            raise ValueError(f"--envs must be at least 1, got {self.envs}")
        if self.seconds <= 0:
            raise ValueError(f"--seconds must be positive, got {self.seconds}")


def _progress(stats) -> None:
    print(f"  {stats.status_line()}", flush=True)


def run_demo(config: DemoConfig) -> dict:
    """Triton + gateway + N MuJoCo sessions for `config.seconds`; returns the summary dict."""
    run_dir = config.run_dir or Path(tempfile.mkdtemp(prefix="tether-demo-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    repo = ModelRepository(run_dir / "models")
    name = write_initial_policy(repo, config.env)
    print(f"run dir {run_dir}\npolicy  {name} v1 (freshly initialised MLP)", flush=True)
    t0 = time.monotonic()
    with TritonServer(repo.root, models=[name], log_path=run_dir / "triton.log") as triton:
        print(f"triton  {triton.version} on {triton.grpc_url} (ready in {time.monotonic() - t0:.1f} s)")
        with gateway_process(triton_url=triton.grpc_url, policy=name, log_path=run_dir / "gateway.log") as gw:
            print(f"gateway {gw}\nsim     {config.envs} x {config.env} for {config.seconds:g} s", flush=True)
            stats = asyncio.run(run_sessions(gw, lambda i: make_env(config.env, seed=i), envs=config.envs,
                                             seconds=config.seconds, on_progress=_progress))
        summary = stats.summary()
        summary["triton_version"] = triton.version
    summary["error_codes"] = summary["errors"]
    summary["errors"] = sum(summary["error_codes"].values())
    print_table(summary)
    if config.summary:
        write_json(config.summary, summary)
    return summary


def print_table(summary: dict) -> None:
    rows = [("steps", f"{summary['steps']}"), ("steps/s", f"{summary['steps_per_s']:.0f}"),
            ("sessions", f"{summary['sessions']}"), ("round trip p50", f"{summary['rtt_ms']['p50']} ms"),
            ("round trip p99", f"{summary['rtt_ms']['p99']} ms"),
            ("triton version", summary["triton_version"]), ("errors", f"{summary['errors']}")]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))


def write_json(path: Path, data: dict) -> None:
    """Atomically: a reader never sees a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
