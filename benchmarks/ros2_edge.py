"""The robot side on the ROS 2 wire: an independent robot process, the edge node, the gateway and
Triton, against raw DDS ping-pong as the floor. One run measures:

1. lockstep reaction at 100 Hz: the robot publishes state k+1 only after the command for state k
   arrived (and not before its period); reaction = state published -> its command received;
2. free-running robots at 100, 500 and 1000 Hz, the edge at the robot's rate: periods answered
   (wall-clock robot periods in which at least one command arrived), states answered (distinct
   states a command names, per period) and command jitter (spread of the intervals between
   commands), per step (one action per observation) and chunked (H actions per observation);
3. each with the edge on rclpy (Fast DDS, from .venv/ros) and on Cyclone DDS (`--transport dds`).

    python benchmarks/ros2_edge.py [--rates 100,500,1000 --seconds 4 --warmup 1 --chunk 50 --json PATH]

Processes, all on 127.0.0.1, one DDS domain, loopback only (Cyclone: `loopback_config`; Fast DDS:
launch/config/fastdds_loopback.xml):

    robot (rclpy, tests/ros2/rclpy_robot.py; the Cyclone robot tests/ros2/edge_robot.py without .venv/ros)
      --/joint_states--> tether edge (rclpy | dds) --gRPC--> gateway (process) --> Triton (process)
      <--/policy_controller/commands--
    floor: the robot <-> an echo process answering each JointState at once in its DDS callback

The robot numbers its states in the velocities ((i % 4000) / 2000); the policy is action = velocity
(+ 0 x a 64x64 MLP, so Triton runs a real network; the chunked one repeats it H times), so every
per-step command names the state it answers, and the robot prints each command's arrival time and,
for a numbered one, its latency. The guard runs with a velocity limit of 100/s here (the numbering
jumps from 2 to 0 every 4000 states), so it checks every command and limits none.

Why an earlier version reported about half of the states answered at 500 Hz, where a robot run by
hand saw about 98%: its robot lived in the benchmark's own process (its publish loop, its DDS
receive callbacks and the bookkeeping shared one interpreter), and the edge sent observations on
its own timer, one in flight, with robot and edge phases sweeping against each other: a state
published just after a tick waited a whole period, and the next one found the previous still in
flight. Now the robot is its own process (as on a robot), the edge sends each state as it arrives,
and "answered" is counted per robot period, the way the robot sees it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from bridge.ros2.dds import DdsTransport, loopback_config
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map
from inference_server import ModelRepository, TritonServer
from protos.codec import Spec
from tether.topology import gateway_process, stop_process, write_json

ROOT = Path(__file__).resolve().parents[1]
ROS_PYTHON = ROOT / ".venv" / "ros" / "bin" / "python"
FASTDDS_PROFILE = ROOT / "launch" / "config" / "fastdds_loopback.xml"
RCLPY_ROBOT, DDS_ROBOT = ROOT / "tests" / "ros2" / "rclpy_robot.py", ROOT / "tests" / "ros2" / "edge_robot.py"
STEP_MODEL, CHUNK_MODEL = "bench_edge_echo", "bench_edge_chunk"
SCALE = 2000.0


class EchoVelocity(torch.nn.Module):
    """action = joint_velocity (+ 0 x a 64x64 MLP); with `horizon`, that action H times."""

    def __init__(self, n: int, horizon: int = 0):
        super().__init__()
        torch.manual_seed(0)
        self.horizon = horizon
        self.net = torch.nn.Sequential(torch.nn.Linear(2 * n, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                       torch.nn.Tanh(), torch.nn.Linear(64, n), torch.nn.Tanh())

    def forward(self, joint_position: torch.Tensor, joint_velocity: torch.Tensor) -> torch.Tensor:
        action = joint_velocity + 0.0 * self.net(torch.cat([joint_position, joint_velocity], dim=1))
        if self.horizon:
            return action.unsqueeze(1).repeat(1, self.horizon, 1)
        return action


def ros_env(domain: int) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "ROS_DOMAIN_ID": str(domain),
            "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp",
            "FASTRTPS_DEFAULT_PROFILES_FILE": str(FASTDDS_PROFILE), "AMENT_PREFIX_PATH": str(ROOT / ".venv" / "ros")}


def rclpy_ok() -> bool:
    if not ROS_PYTHON.exists():
        return False
    return subprocess.run([str(ROS_PYTHON), "-c", "import rclpy, bridge.ros2.rclpy_transport"], env=ros_env(0),
                          capture_output=True, timeout=60).returncode == 0


class RobotProcess:
    """The robot: its command lines (t, data, lat_ms) collect in `commands`."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log = open(log, "w")  # noqa: SIM115 (closed in close())
        self.out = log.with_suffix(".json")    # the robot keeps its records until it exits: no pipe per command
        self.proc = subprocess.Popen([*argv, "--out", str(self.out)], env=env, cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, start_new_session=True)
        self.commands: list[dict] = []
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._pump, daemon=True).start()
        try:
            if self.events.get(timeout=60) != "ready":
                raise RuntimeError(f"robot not ready; see {log}")
        except queue.Empty:
            raise RuntimeError(f"robot not ready in 60 s; see {log}") from None

    def _pump(self) -> None:
        for line in self.proc.stdout:
            record = json.loads(line)
            if "event" in record:
                self.events.put(record["event"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stop_process(self.proc)
        self.log.close()
        self.commands = json.loads(self.out.read_text()) if self.out.exists() else []


@contextlib.contextmanager
def child(argv: list[str], env: dict[str, str], log: Path):
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    stop_process(proc)


def summarize(commands: list[dict], rate: float, t0: float, seconds: float, *, latency: bool = True) -> dict:
    """Periods answered, states answered, latency of numbered commands (not for chunks: a chunk's
    commands all name the one state it was computed from), jitter of arrivals."""
    window = [c for c in commands if t0 <= c["t"] < t0 + seconds]
    if not latency:
        window = [{**c, "lat_ms": None} if c["lat_ms"] is not None else c for c in window]
    periods = int(round(rate * seconds))
    if not window:
        return {"commands": 0, "periods_answered": 0.0, "states_answered": 0.0, "p50": None, "p99": None,
                "jitter_ms": None}
    t = np.array([c["t"] for c in window])
    answered = len({int((x - t0) * rate) for x in t})
    codes = {round(c["data"][0] * SCALE) for c in window}
    lat = np.array([c["lat_ms"] for c in window if c["lat_ms"] is not None])
    gaps = np.diff(t) * 1e3
    return {"commands": len(window), "periods": periods, "periods_answered": round(min(answered / periods, 1.0), 4),
            "states_answered": round(min(len(codes) / periods, 1.0), 4),
            "p50": round(float(np.percentile(lat, 50)), 3) if lat.size else None,
            "p99": round(float(np.percentile(lat, 99)), 3) if lat.size else None,
            "jitter_ms": {"std": round(float(gaps.std()), 3), "p99_gap": round(float(np.percentile(gaps, 99)), 3),
                          "max_gap": round(float(gaps.max()), 3)} if gaps.size else None}


def block(label: str, robot_argv: list[str], peer_argv: list[str], env: dict[str, str], *, rate: float,
          a: argparse.Namespace, logs: Path, report: Path | None = None, chunked: bool = False) -> dict:
    """Robot up, peer (edge or echo) up, wait for the first command, warm up, measure, stop both."""
    name = label.replace(" ", "_").replace("/", "_")
    robot = RobotProcess(robot_argv, env, logs / f"robot_{name}.log")
    try:
        with child(peer_argv, env, logs / f"peer_{name}.log") as peer:
            robot.proc.stdin.write("first\n")       # the robot says when the first command arrived
            robot.proc.stdin.flush()
            event, deadline = None, time.monotonic() + 60
            with contextlib.suppress(queue.Empty):
                while event not in ("first", "no command"):     # e.g. the edge's estop_state comes first
                    event = robot.events.get(timeout=max(deadline - time.monotonic(), 0.001))
            if event != "first" or peer.poll() is not None:
                raise RuntimeError(f"{label}: no command (peer exit {peer.poll()}); see {logs}")
            t0 = time.monotonic() + a.warmup
            time.sleep(a.warmup + a.seconds + 0.2)
    finally:
        robot.close()
    result = summarize(robot.commands, rate, t0, a.seconds, latency=not chunked)
    if report is not None and report.exists():
        stats = json.loads(report.read_text())["stats"]
        result["edge"] = {k: stats[k] for k in ("rtt_ms", "ticks", "starved", "overruns", "observations", "errors")}
    lat = "" if result["p50"] is None else f"latency p50 {result['p50']:.2f} ms p99 {result['p99']:.2f} ms, "
    jitter = result["jitter_ms"] or {}
    print(f"  {label}: {lat}periods answered {result['periods_answered']:.1%}, states answered "
          f"{result['states_answered']:.1%}, jitter std {jitter.get('std', float('nan')):.2f} ms", flush=True)
    return result


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="100,500,1000", help="free-running robot rates (Hz); the edge runs at each")
    p.add_argument("--lockstep-rate", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per block")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds after the first command, not measured")
    p.add_argument("--chunk", type=int, default=50, help="chunk horizon H of the chunked policy")
    p.add_argument("--domain-id", type=int, default=random.SystemRandom().randrange(1, 233))
    p.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)  # the floor's peer process
    p.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "ros2_edge.json")
    a = p.parse_args(argv)
    os.environ["CYCLONEDDS_URI"] = loopback_config(a.domain_id)  # before any participant; children inherit
    os.environ["ROS_DOMAIN_ID"] = str(a.domain_id)
    if a.echo:
        echo(a.domain_id)
        return None
    tmap = load_topic_map(DEFAULT_TOPIC_MAP)
    n = tmap.action_specs()[0].shape[0]
    joints = ",".join(tmap.observation[0].joints)
    rates = [float(x) for x in a.rates.split(",")]
    have_rclpy = rclpy_ok()
    transports = ["rclpy", "dds"] if have_rclpy else ["dds"]
    run_dir = Path(tempfile.mkdtemp(prefix="tether-bench-ros2-"))
    obs, act = tmap.observation_specs(), tmap.action_specs()
    repo = ModelRepository(run_dir / "models")
    repo.write_version(STEP_MODEL, 1, EchoVelocity(n), obs, act)
    repo.write_version(CHUNK_MODEL, 1, EchoVelocity(n, a.chunk), obs, (Spec("action", np.float32, (a.chunk, n)),))
    env = ros_env(a.domain_id)
    robot_python, robot_script = (ROS_PYTHON, RCLPY_ROBOT) if have_rclpy else (Path(sys.executable), DDS_ROBOT)
    robot_kind = "rclpy (Fast DDS)" if have_rclpy else "Cyclone DDS (no .venv/ros)"
    print(f"run dir {run_dir}; DDS domain {a.domain_id}, loopback only; robot: {robot_kind}", flush=True)

    def robot_argv(rate: float, lockstep: bool = False) -> list[str]:
        extra = ["--lockstep"] if lockstep else []
        domain = [] if have_rclpy else ["--domain", str(a.domain_id)]
        return [str(robot_python), str(robot_script), *domain, "--joints", joints, "--hz", f"{rate:g}",
                "--seconds", str(a.warmup + a.seconds + 30), *extra]

    def edge_argv(transport: str, rate: float, chunked: bool, report: Path) -> list[str]:
        python = ROS_PYTHON if transport == "rclpy" else Path(sys.executable)
        chunk = ["--policy", CHUNK_MODEL, "--chunk", str(a.chunk)] if chunked else ["--policy", STEP_MODEL]
        return [str(python), "-m", "bridge.ros2.edge", "--gateway", gw, "--transport", transport, "--domain-id",
                str(a.domain_id), "--rate", f"{rate:g}", "--velocity-limit", "100", "--status-s", "3600",
                "--node-name", "bench_edge", "--report", str(report), *chunk]

    echo_argv = [sys.executable, str(Path(__file__).resolve()), "--echo", "--domain-id", str(a.domain_id)]
    result: dict = {"machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                                "cpus": os.cpu_count()}, "robot": robot_kind, "seconds": a.seconds,
                    "warmup_s": a.warmup, "chunk": a.chunk, "lockstep": {}, "free": []}
    models = [STEP_MODEL, CHUNK_MODEL]
    with TritonServer(run_dir / "models", models=models, log_path=run_dir / "triton.log") as triton, \
            gateway_process(triton_url=triton.grpc_url, policy=STEP_MODEL, log_path=run_dir / "gateway.log") as gw:
        print(f"triton {triton.version} on {triton.grpc_url}, gateway {gw}", flush=True)
        rate = a.lockstep_rate
        result["lockstep"]["raw DDS ping-pong"] = block(f"lockstep {rate:g} Hz raw DDS", robot_argv(rate, True),
                                                        echo_argv, env, rate=rate, a=a, logs=run_dir)
        for transport in transports:
            report = run_dir / f"report_lockstep_{transport}.json"
            result["lockstep"][f"edge {transport}"] = block(
                f"lockstep {rate:g} Hz edge {transport}", robot_argv(rate, True),
                edge_argv(transport, rate, False, report), env, rate=rate, a=a, logs=run_dir, report=report)
        for rate in rates:
            row = {"rate_hz": rate, "raw DDS ping-pong": block(f"{rate:g} Hz raw DDS", robot_argv(rate), echo_argv,
                                                               env, rate=rate, a=a, logs=run_dir)}
            for transport in transports:
                for chunked in (False, True):
                    label = f"edge {transport} {'chunked' if chunked else 'per step'}"
                    report = run_dir / f"report_{rate:g}_{transport}_{chunked}.json"
                    row[label] = block(f"{rate:g} Hz {label}", robot_argv(rate), edge_argv(transport, rate, chunked,
                                                                                          report),
                                       env, rate=rate, a=a, logs=run_dir, report=report, chunked=chunked)
            result["free"].append(row)
        result["triton_version"] = triton.version
    result["logs"] = str(run_dir)
    print_table(result)
    write_json(a.json, result)
    print(f"wrote {a.json}")
    return result


def echo(domain: int) -> None:
    """The floor's peer: each JointState answered at once, in the receive callback (Cyclone DDS)."""
    tmap = load_topic_map(DEFAULT_TOPIC_MAP)
    obs, act = tmap.observation[0], tmap.action[0]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with DdsTransport(domain_id=domain, node_name="bench_echo") as transport:
        publish = transport.publisher(act.topic, act.type, reliable=act.reliable)

        def answer(msg) -> None:
            arrays = tmap.observation_arrays({obs.topic: msg})
            for _, command in tmap.commands({"action": arrays["joint_velocity"]}):
                publish(command)

        transport.subscribe(obs.topic, obs.type, answer, reliable=obs.reliable)
        stop.wait(3600)


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(r: dict) -> None:
    print(f"\nlockstep at the robot's {list(r['lockstep'])} rate: state -> command reaction")
    print(f"{'path':<24}{'p50 ms':>9}{'p99 ms':>9}")
    for name, x in r["lockstep"].items():
        print(f"{name:<24}{_fmt(x['p50']):>9}{_fmt(x['p99']):>9}")
    print(f"\nfree-running robot, edge at the robot's rate (chunks of {r['chunk']})")
    print(f"{'rate':>7}  {'path':<26}{'periods':>9}{'states':>8}{'p50 ms':>8}{'p99 ms':>8}{'jitter':>8}"
          f"{'p99 gap':>9}{'edge rtt p50':>14}")
    for row in r["free"]:
        for name, x in row.items():
            if name == "rate_hz":
                continue
            jitter = x.get("jitter_ms") or {}
            rtt = (x.get("edge") or {}).get("rtt_ms", {}).get("p50")
            print(f"{row['rate_hz']:>4g} Hz  {name:<26}{x['periods_answered']:>9.1%}{x['states_answered']:>8.1%}"
                  f"{_fmt(x['p50']):>8}{_fmt(x['p99']):>8}{_fmt(jitter.get('std')):>8}{_fmt(jitter.get('p99_gap')):>9}"
                  f"{_fmt(rtt):>14}")


if __name__ == "__main__":
    main()
