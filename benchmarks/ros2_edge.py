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
    python benchmarks/ros2_edge.py --rates "" --seconds 4        # lockstep only

Processes, all on 127.0.0.1, one DDS domain, loopback only (Cyclone: `loopback_config`; Fast DDS:
launch/config/fastdds_loopback.xml):

    robot: C++ on Fast DDS 2.9 (tests/peers/fastdds_peer --bench 1, built by `make setup`; else the
           rclpy robot tests/ros2/rclpy_robot.py, else the Cyclone one tests/ros2/edge_robot.py)
      --/joint_states--> tether edge (rclpy | dds) --gRPC--> gateway (process) --> Triton (process)
      <--/policy_controller/commands--
    floors: the robot <-> an echo process answering each JointState at once in its receive
            callback, with Tether's Cyclone DDS transport and with its rclpy transport

The robot numbers its states in the velocities ((i % 4000) / 2000); the policy is action = velocity
(+ 0 x a 64x64 MLP, so Triton runs a real network; the chunked one repeats it H times), so every
per-step command names the state it answers. The robot times each command's arrival (and, for a
numbered one, its latency) and each state's publication on its own monotonic clock, and hands
them over when it stops. The guard runs with a velocity limit of 100/s here (the numbering
jumps from 2 to 0 every 4000 states), so it checks every command and limits none.

Why an earlier version reported about half of the states answered at 500 Hz, where an
independent Fast DDS robot run by hand saw about 98%: its robot was Python inside the benchmark's
own process (publish loop, DDS receive callbacks and bookkeeping in one interpreter). Measured
here on the shared 2-core box, a Python robot (rclpy or Cyclone) cannot keep a 500 Hz loop and
take 500 commands/s: even raw ping-pong then answers a minority of periods with latencies of tens
of ms, i.e. the robot, not the edge, was measured. Now the robot is the C++ Fast DDS peer in its
own process, as on a robot; the edge also sends each state as it arrives (no wait for its timer),
and "answered" is counted per robot period, on the robot's clock.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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
from bench import machine, parser, report

from bridge.common.percentiles import percentile
from bridge.common.processes import stop_group
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map
from bridge.ros2.transports import open_transport

# Cyclone DDS, torch, Triton and the gateway are imported in main(): the echo peer (--echo rclpy)
# runs from .venv/ros, which has none of them

ROOT = Path(__file__).resolve().parents[1]
ROS_PYTHON = ROOT / ".venv" / "ros" / "bin" / "python"
FASTDDS_PROFILE = ROOT / "launch" / "config" / "fastdds_loopback.xml"
RCLPY_ROBOT, DDS_ROBOT = ROOT / "tests" / "ros2" / "rclpy_robot.py", ROOT / "tests" / "ros2" / "edge_robot.py"
FASTDDS_PEER = ROOT / "tests" / "peers" / "build" / "fastdds_peer"
STEP_MODEL, CHUNK_MODEL = "bench_edge_echo", "bench_edge_chunk"
PEER_TOPIC_MAP = """# the C++ robot's joints (tests/peers/fastdds_peer.cpp)
observation:
  - topic: /joint_states
    type: sensor_msgs/msg/JointState
    joints: &joints [shoulder, elbow, wrist]
    tensors: {joint_position: {field: position}, joint_velocity: {field: velocity}}
action:
  - topic: /policy_controller/commands
    type: std_msgs/msg/Float64MultiArray
    joints: *joints
    tensors: {action: {field: data, bounds: [-6.2832, 6.2832], velocity_limit: 2.0}}
"""
SCALE = 2000.0


def echo_velocity(n: int, horizon: int = 0):
    """action = joint_velocity (+ 0 x a 64x64 MLP); with `horizon`, that action H times."""
    import torch

    class EchoVelocity(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(2 * n, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                           torch.nn.Tanh(), torch.nn.Linear(64, n), torch.nn.Tanh())

        def forward(self, joint_position: torch.Tensor, joint_velocity: torch.Tensor) -> torch.Tensor:
            action = joint_velocity + 0.0 * self.net(torch.cat([joint_position, joint_velocity], dim=1))
            if horizon:
                return action.unsqueeze(1).repeat(1, horizon, 1)
            return action

    return EchoVelocity()


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
    """The robot. Python robots (--out) keep their records until they exit; the C++ Fast DDS robot
    (`fastdds_peer --bench 1`) prints them as one line when stopped. Either way no pipe write per
    command while measuring. After `close()`: `commands` (t, data, lat_ms) and `published` (t)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log = open(log, "w")  # noqa: SIM115 (closed in close())
        self.native = Path(argv[0]).name == "fastdds_peer"
        self.out = log.with_suffix(".json")
        argv = argv if self.native else [*argv, "--out", str(self.out)]
        self.proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, start_new_session=True)
        self.commands: list[dict] = []
        self.published: list[float] = []
        self.bench: dict | None = None
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.wait_event(("ready",), 60, log)

    def _pump(self) -> None:
        for line in self.proc.stdout:
            record = json.loads(line)
            if "event" in record:
                self.events.put(record["event"])
            elif "bench" in record:
                self.bench = record["bench"]

    def wait_event(self, names: tuple[str, ...], timeout: float, log: Path) -> str:
        deadline, event = time.monotonic() + timeout, None
        with contextlib.suppress(queue.Empty):
            while event not in names:           # other events (e.g. the edge's estop_state) are skipped
                event = self.events.get(timeout=max(deadline - time.monotonic(), 0.001))
        if event not in names:
            raise RuntimeError(f"robot: none of {names} in {timeout:g} s; see {log}")
        return event

    def wait_first_command(self, log: Path) -> None:
        if self.native:                         # the edge's command publisher matched: it is up
            self.wait_event(("reader_matched",), 60, log)
            return
        self.proc.stdin.write("first\n")        # the robot says when the first command arrived
        self.proc.stdin.flush()
        if self.wait_event(("first", "no command"), 70, log) != "first":
            raise RuntimeError(f"robot: no command; see {log}")

    def close(self) -> None:
        if self.native:
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        if self.native:
            time.sleep(0.1)                     # the pump reads the last line
            kept = self.bench or {"commands": [], "published": []}
            self.commands = [{"t": t, "data": [d], "lat_ms": lat} for t, d, lat in kept["commands"]]
            self.published = kept["published"]
            return
        kept = json.loads(self.out.read_text()) if self.out.exists() else {"commands": [], "published": []}
        self.commands, self.published = kept["commands"], kept["published"]


@contextlib.contextmanager
def child(argv: list[str], env: dict[str, str], log: Path):
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            yield proc
        finally:
            stop_group(proc, grace_s=15)  # SIGTERM, SIGKILL after 15 s


def summarize(commands: list[dict], published: list[float], rate: float, t0: float, seconds: float, *,
              latency: bool = True) -> dict:
    """The robot's view of one measured window:

    - periods answered: of the robot's periods (from one JointState's publication to the next),
      those in which at least one command arrived;
    - states answered: distinct states that commands name, per period (chunks: observations used);
    - latency (per step only; a chunk's commands all name the one state it was computed from):
      publication of a state -> arrival of the first command naming it;
    - jitter: the spread of the intervals between command arrivals.
    """
    window = [c for c in commands if t0 <= c["t"] < t0 + seconds]
    pubs = np.array([x for x in published if t0 <= x < t0 + seconds])
    periods = max(len(pubs) - 1, 1)
    if not window or len(pubs) < 2:
        return {"commands": len(window), "periods": periods, "periods_answered": 0.0, "states_answered": 0.0,
                "p50": None, "p99": None, "jitter_ms": None}
    t = np.array([c["t"] for c in window])
    slots = np.searchsorted(pubs, t, side="right") - 1           # the robot period each command landed in
    answered = len({int(k) for k in slots if 0 <= k < len(pubs) - 1})
    codes = {round(c["data"][0] * SCALE) for c in window}
    lat = np.array([c["lat_ms"] for c in window if c["lat_ms"] is not None]) if latency else np.array([])
    gaps = np.diff(t) * 1e3
    return {"commands": len(window), "periods": periods, "robot_rate_hz": round(periods / (pubs[-1] - pubs[0]), 1),
            "periods_answered": round(answered / periods, 4), "states_answered": round(min(len(codes) / periods, 1), 4),
            "p50": round(float(percentile(lat.tolist(), 50)), 3) if lat.size else None,   # nearest rank
            "p99": round(float(percentile(lat.tolist(), 99)), 3) if lat.size else None,
            "jitter_ms": {"std": round(float(gaps.std()), 3), "p99_gap": round(float(percentile(gaps.tolist(), 99)), 3),
                          "max_gap": round(float(gaps.max()), 3)} if gaps.size else None}


def block(label: str, robot_argv: list[str], peer_argv: list[str], env: dict[str, str], *, rate: float,
          a: argparse.Namespace, logs: Path, report: Path | None = None, chunked: bool = False) -> dict:
    """Robot up, peer (edge or echo) up, wait for the first command, warm up, measure, stop both."""
    name = label.replace(" ", "_").replace("/", "_")
    robot = RobotProcess(robot_argv, env, logs / f"robot_{name}.log")
    try:
        with child(peer_argv, env, logs / f"peer_{name}.log") as peer:
            robot.wait_first_command(logs / f"robot_{name}.log")
            if peer.poll() is not None:
                raise RuntimeError(f"{label}: the peer exited ({peer.poll()}); see {logs}")
            t0 = time.monotonic() + a.warmup
            time.sleep(a.warmup + a.seconds + 0.2)
    finally:
        robot.close()
    result = summarize(robot.commands, robot.published, rate, t0, a.seconds, latency=not chunked)
    if report is not None and report.exists():
        stats = json.loads(report.read_text())["stats"]
        result["edge"] = {k: stats[k] for k in ("rtt_ms", "gateway_ms", "inference_ms", "ticks", "starved", "overruns",
                                                "observations", "errors")}
    lat = "" if result["p50"] is None else f"latency p50 {result['p50']:.2f} ms p99 {result['p99']:.2f} ms, "
    jitter = result["jitter_ms"] or {}
    print(f"  {label}: {lat}periods answered {result['periods_answered']:.1%}, states answered "
          f"{result['states_answered']:.1%}, jitter std {jitter.get('std', float('nan')):.2f} ms", flush=True)
    return result


def main(argv: list[str] | None = None) -> dict | None:
    p = parser(__file__, __doc__)
    p.add_argument("--rates", default="100,500,1000", help="free-running robot rates (Hz); the edge runs at each")
    p.add_argument("--lockstep-rate", type=float, default=100.0)
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds per block")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds after the first command, not measured")
    p.add_argument("--chunk", type=int, default=50, help="chunk horizon H of the chunked policy")
    p.add_argument("--domain-id", type=int, default=random.SystemRandom().randrange(1, 233))
    p.add_argument("--robot", choices=("auto", "fastdds", "python"), default="auto",
                   help="the robot process: the C++ Fast DDS robot where built (auto), or the Python one")
    p.add_argument("--echo", choices=("dds", "rclpy"), help=argparse.SUPPRESS)  # the floors' peer process
    p.add_argument("--topic-map", type=Path, default=DEFAULT_TOPIC_MAP, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.echo == "rclpy":
        echo(a.domain_id, a.echo, a.topic_map)
        return None
    from bridge.ros2.dds import loopback_config

    os.environ["CYCLONEDDS_URI"] = loopback_config(a.domain_id)  # before any participant; children inherit
    os.environ["ROS_DOMAIN_ID"] = str(a.domain_id)
    if a.echo:
        echo(a.domain_id, a.echo, a.topic_map)
        return None
    from inference_server import ModelRepository, TritonServer
    from protos.codec import Spec
    from tether.topology import gateway_process

    rates = [float(x) for x in a.rates.split(",") if x.strip()]      # "": lockstep only
    have_rclpy = rclpy_ok()
    transports = ["rclpy", "dds"] if have_rclpy else ["dds"]
    run_dir = Path(tempfile.mkdtemp(prefix="tether-bench-ros2-"))
    native = os.access(FASTDDS_PEER, os.X_OK) and a.robot in ("auto", "fastdds")
    if native:                         # the C++ robot has three joints: its own topic map
        topic_map = run_dir / "topic_map.yaml"
        topic_map.write_text(PEER_TOPIC_MAP)
        robot_kind = "C++ on Fast DDS 2.9 (tests/peers/fastdds_peer --bench 1)"
    else:
        topic_map = DEFAULT_TOPIC_MAP
        robot_kind = "rclpy (Fast DDS 2.14)" if have_rclpy else "Cyclone DDS (no .venv/ros, no C++ peer)"
    tmap = load_topic_map(topic_map)
    n = tmap.action_specs()[0].shape[0]
    joints = ",".join(tmap.observation[0].joints)
    obs, act = tmap.observation_specs(), tmap.action_specs()
    repo = ModelRepository(run_dir / "models")
    repo.write_version(STEP_MODEL, 1, echo_velocity(n), obs, act)
    repo.write_version(CHUNK_MODEL, 1, echo_velocity(n, a.chunk), obs, (Spec("action", np.float32, (a.chunk, n)),))
    env = ros_env(a.domain_id)
    robot_python, robot_script = (ROS_PYTHON, RCLPY_ROBOT) if have_rclpy else (Path(sys.executable), DDS_ROBOT)
    print(f"run dir {run_dir}; DDS domain {a.domain_id}, loopback only; robot: {robot_kind}", flush=True)

    def robot_argv(rate: float, lockstep: bool = False) -> list[str]:
        if native:
            return [str(FASTDDS_PEER), "--domain", str(a.domain_id), "--bench", "1", "--lockstep", str(int(lockstep)),
                    "--hz", f"{rate:g}", "--timeout", str(a.warmup + a.seconds + 60)]
        extra = ["--lockstep"] if lockstep else []
        domain = [] if have_rclpy else ["--domain", str(a.domain_id)]
        return [str(robot_python), str(robot_script), *domain, "--joints", joints, "--hz", f"{rate:g}",
                "--seconds", str(a.warmup + a.seconds + 30), *extra]

    def edge_argv(transport: str, rate: float, chunked: bool, summary: Path) -> list[str]:
        python = ROS_PYTHON if transport == "rclpy" else Path(sys.executable)
        chunk = ["--policy", CHUNK_MODEL, "--chunk", str(a.chunk)] if chunked else ["--policy", STEP_MODEL]
        return [str(python), "-m", "tether", "edge", "--gateway", gw, "--transport", transport, "--domain-id",
                str(a.domain_id), "--rate", f"{rate:g}", "--velocity-limit", "100", "--status-every", "3600",
                "--node-name", "bench_edge", "--summary", str(summary), "--topic-map", str(topic_map), *chunk]

    floors = {"raw DDS ping-pong": [sys.executable, str(Path(__file__).resolve()), "--echo", "dds",
                                    "--domain-id", str(a.domain_id), "--topic-map", str(topic_map)]}
    if have_rclpy:
        floors["raw rclpy ping-pong"] = [str(ROS_PYTHON), str(Path(__file__).resolve()), "--echo", "rclpy",
                                         "--domain-id", str(a.domain_id), "--topic-map", str(topic_map)]
    result: dict = {"machine": machine(cpus=os.cpu_count(), load_average_before=[round(x, 2) for x in os.getloadavg()]),
                    "robot": robot_kind, "seconds": a.seconds, "warmup_s": a.warmup, "chunk": a.chunk,
                    "lockstep_rate_hz": a.lockstep_rate, "lockstep": {}, "free": []}
    models = [STEP_MODEL, CHUNK_MODEL]
    with TritonServer(run_dir / "models", models=models, log_path=run_dir / "triton.log") as triton, \
            gateway_process(triton_url=triton.grpc_url, policy=STEP_MODEL, log_path=run_dir / "gateway.log") as gw:
        print(f"triton {triton.version} on {triton.grpc_url}, gateway {gw}", flush=True)
        rate = a.lockstep_rate
        for floor, argv_ in floors.items():
            result["lockstep"][floor] = block(f"lockstep {rate:g} Hz {floor}", robot_argv(rate, True), argv_, env,
                                              rate=rate, a=a, logs=run_dir)
        for transport in transports:
            summary = run_dir / f"report_lockstep_{transport}.json"
            result["lockstep"][f"edge {transport}"] = block(
                f"lockstep {rate:g} Hz edge {transport}", robot_argv(rate, True),
                edge_argv(transport, rate, False, summary), env, rate=rate, a=a, logs=run_dir, report=summary)
        for rate in rates:
            row = {"rate_hz": rate}
            for floor, argv_ in floors.items():
                row[floor] = block(f"{rate:g} Hz {floor}", robot_argv(rate), argv_, env, rate=rate, a=a, logs=run_dir)
            for transport in transports:
                for chunked in (False, True):
                    label = f"edge {transport} {'chunked' if chunked else 'per step'}"
                    summary = run_dir / f"report_{rate:g}_{transport}_{chunked}.json"
                    row[label] = block(f"{rate:g} Hz {label}", robot_argv(rate), edge_argv(transport, rate, chunked,
                                                                                          summary),
                                       env, rate=rate, a=a, logs=run_dir, report=summary, chunked=chunked)
            result["free"].append(row)
        result["triton_version"] = triton.version
    result["logs"] = str(run_dir)
    result["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return report(a.json, result, print_table)


def echo(domain: int, kind: str, topic_map: Path) -> None:
    """The floors' peer: each JointState answered at once, in the receive callback, on Tether's
    Cyclone DDS or rclpy transport (the edge's own message code, no gateway)."""
    tmap = load_topic_map(topic_map)
    obs, act = tmap.observation[0], tmap.action[0]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with open_transport(kind, domain_id=domain, node_name="bench_echo") as transport:
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
    print(f"\nlockstep robot at {r['lockstep_rate_hz']:g} Hz: state -> command reaction (robot: {r['robot']})")
    print(f"{'path':<24}{'p50 ms':>9}{'p99 ms':>9}{'edge rtt p50':>14}{'in gateway':>12}{'inference':>11}")
    for name, x in r["lockstep"].items():
        e = x.get("edge") or {}
        print(f"{name:<24}{_fmt(x['p50']):>9}{_fmt(x['p99']):>9}{_fmt(e.get('rtt_ms', {}).get('p50')):>14}"
              f"{_fmt(e.get('gateway_ms', {}).get('p50')):>12}{_fmt(e.get('inference_ms', {}).get('p50')):>11}")
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
