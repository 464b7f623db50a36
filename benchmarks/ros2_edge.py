"""JointState published -> command received on the ROS 2 wire, through the edge node, the gateway
and Triton, next to a raw DDS ping-pong between the same two kinds of processes, at 100 and 500 Hz.

    python benchmarks/ros2_edge.py [--rates 100,500 --seconds 6 --warmup 1 --domain-id N --json PATH]

Everything is on 127.0.0.1; every DDS participant (this process and its DDS children) runs with a
loopback-only `CYCLONEDDS_URI` (`bridge.ros2.dds.loopback_config`) on one dedicated domain id:

    robot (this process) --/joint_states--> `tether edge --transport dds` --gRPC--> gateway --> Triton
    robot <--/policy_controller/commands--  (subprocess)                   (subprocess)  (subprocess)

The baseline swaps the edge subprocess for an echo subprocess (this file with `--echo`) that
answers each JointState at once, in its DDS receive callback, with the Float64MultiArray the topic
map makes of it: the same message types, QoS, transport code and conversions, no gateway.

Matching a command to its JointState: the robot numbers its JointStates and writes the number into
the first two joint positions as dyadic fractions (seq % 2048 / 1024, seq // 2048 % 2048 / 1024),
exact in float32 and inside the joint bounds. The policy is action = joint_position (+ 0 x a small
MLP, so Triton runs a real network); the guard passes it unchanged; so every command names the
JointState it was computed from. Latency = arrival of the first command naming a JointState minus
that JointState's publication, both on this process's perf_counter. Later commands naming the same
JointState (resent state, watchdog hold) are counted as repeats; JointStates that no command names
(the edge samples the latest state once per period and keeps one observation in flight) are
counted as unanswered. The edge path therefore includes the wait for the edge's next control tick:
robot and edge are not phase-locked, so the robot publishes one message per block more than
`rate * seconds` and the phase sweeps one whole period during each block instead of sitting at one
arbitrary offset. The edge's own observation -> action round trip is reported beside it.

The edge's round trip is then compared with a plain grpc.aio Bridge session in this process, on
the same gateway and policy with the same observation: once stepping like the edge (one
observation per control period, the next one at the first period boundary after the reply) and
once back to back, as benchmarks/loop_latency.py does. On a small shared machine the paced loop
is the fair reference: a process that idles between steps runs every hop of the next one cold
(Triton, the gateway, the sockets), so a paced round trip is far slower than a back-to-back one
whoever sends it. For every round trip the gateway's own share comes from Action.timing
(gateway receive -> send, and Triton's inference inside it, both on the gateway's clock).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import torch

from bridge.ros2 import messages
from bridge.ros2.dds import DdsTransport, loopback_config
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, TopicMap, load_topic_map
from inference_server import ModelRepository, TritonServer
from protos import bridge_pb2, bridge_pb2_grpc
from protos.codec import encode_all
from tether.topology import gateway_process, stop_process, write_json

ROOT = Path(__file__).resolve().parents[1]
MODEL = "bench_edge_echo"
DIGIT, SCALE = 2048, 1024.0


class EchoPolicy(torch.nn.Module):
    """action = joint_position, plus 0 x a 64x64 MLP of the whole observation (a real network runs)."""

    def __init__(self, n: int):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(2 * n, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                       torch.nn.Tanh(), torch.nn.Linear(64, n), torch.nn.Tanh())

    def forward(self, joint_position: torch.Tensor, joint_velocity: torch.Tensor) -> torch.Tensor:
        return joint_position + 0.0 * self.net(torch.cat([joint_position, joint_velocity], dim=1))


def encode_seq(seq: int, n: int) -> np.ndarray:
    position = np.zeros(n)
    position[0], position[1] = seq % DIGIT / SCALE, seq // DIGIT % DIGIT / SCALE
    return position


def decode_seq(data) -> int:
    return round(data[0] * SCALE) + DIGIT * round(data[1] * SCALE)


def percentiles(ns: list[int]) -> dict:
    if not ns:
        return {"p50": None, "p99": None, "n": 0}
    p50, p99 = np.percentile(np.asarray(ns) / 1e6, [50, 99])
    return {"p50": round(float(p50), 3), "p99": round(float(p99), 3), "n": len(ns)}


class Robot:
    """This process's robot: numbered JointStates out, commands in, publish -> command latencies."""

    def __init__(self, domain: int, tmap: TopicMap):
        self.obs, self.act = tmap.observation[0], tmap.action[0]
        self.transport = DdsTransport(domain_id=domain, node_name="bench_robot")
        self.lock = threading.Lock()
        self.sent: dict[int, int] = {}       # seq -> perf_counter_ns at publication
        self.latency: dict[int, int] = {}    # seq -> ns until the first command naming it
        self.repeats = self.unknown = self.seq = 0
        self.transport.subscribe(self.act.topic, self.act.type, self._on_command, reliable=True, depth=100)
        self.publish = self.transport.publisher(self.obs.topic, self.obs.type, reliable=self.obs.reliable)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _on_command(self, msg) -> None:
        now = time.perf_counter_ns()
        seq = decode_seq(msg.data)
        with self.lock:
            sent = self.sent.get(seq)
            if sent is None:
                self.unknown += 1
            elif seq in self.latency:
                self.repeats += 1
            else:
                self.latency[seq] = now - sent

    def start(self, rate_hz: float) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(rate_hz,), name="bench-robot", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.transport.raise_if_failed()

    def _run(self, rate_hz: float) -> None:
        n, period, t0, i = len(self.obs.joints), 1.0 / rate_hz, time.perf_counter(), 0
        velocity = np.zeros(n)
        while not self._stop.is_set():
            msg = messages.joint_state(names=self.obs.joints, position=encode_seq(self.seq, n), velocity=velocity)
            with self.lock:
                self.sent[self.seq] = time.perf_counter_ns()
            self.publish(msg)
            self.seq += 1
            i += 1
            delay = t0 + i * period - time.perf_counter()
            if delay < -period:              # fell behind (a busy box): no burst to catch up
                t0, delay = time.perf_counter() - i * period, 0.0
            if delay > 0:
                self._stop.wait(delay)

    def wait_answered(self, after: int, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not any(s >= after for s in list(self.latency)):
            self.transport.raise_if_failed()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no command answered a JointState within {timeout:g} s ({what})")
            time.sleep(0.01)

    def measure(self, seconds: float, label: str) -> dict:
        """Time the JointStates published during the next `seconds`; prints progress every second."""
        with self.lock:
            lo, repeats, unknown = self.seq, self.repeats, self.unknown
        t_end = time.monotonic() + seconds
        while (left := t_end - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            got = [v for s, v in list(self.latency.items()) if s >= lo]
            print(f"  {label}: {seconds - max(t_end - time.monotonic(), 0):4.1f}/{seconds:g} s  {len(got)} timed  "
                  f"p50 {np.median(got) / 1e6 if got else float('nan'):.3f} ms", flush=True)
        hi = self.seq
        time.sleep(0.3)                      # replies still in flight
        with self.lock:
            samples = [self.latency[s] for s in range(lo, hi) if s in self.latency]
            repeats, unknown = self.repeats - repeats, self.unknown - unknown
        return {**percentiles(samples), "published": hi - lo, "answered": round(len(samples) / max(hi - lo, 1), 3),
                "commands_per_s": round(len(samples) / seconds, 1), "repeats": repeats, "unmatched": unknown}

    def close(self) -> None:
        self.stop()
        self.transport.close()


def _die_with_parent() -> None:  # runs in the child before exec: SIGTERM when the benchmark dies
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def child(cmd: list[str], log_path: Path):
    """A DDS child process (inherits the loopback CYCLONEDDS_URI); SIGTERM, then SIGKILL, on exit."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
                                preexec_fn=_die_with_parent)
        try:
            yield proc
        finally:
            stop_process(proc)


def block(robot: Robot, cmd: list[str], log_path: Path, *, rate: float, a: argparse.Namespace, label: str) -> dict:
    """Start the peer, wait for its first answer, warm up, measure, stop the peer."""
    t0 = time.monotonic()
    with child(cmd, log_path) as proc:
        robot.start(rate + 1.0 / a.seconds)  # one extra message per block: the phase sweeps a period
        try:
            start = robot.seq
            robot.wait_answered(start, 60.0, f"{label}; see {log_path}")
            print(f"  {label}: first answer after {time.monotonic() - t0:.1f} s; warm-up {a.warmup:g} s", flush=True)
            time.sleep(a.warmup)
            result = robot.measure(a.seconds, label)
        finally:
            robot.stop()
        if proc.poll() is not None:
            raise RuntimeError(f"{label}: the peer exited with code {proc.returncode}; see {log_path}")
    return result


async def session(gateway: str, tmap: TopicMap, *, rate: float | None, seconds: float, warmup: float) -> dict:
    """A plain grpc.aio Bridge session: round trips (write -> read) and the gateway's share of each.

    rate=None: back to back. Otherwise like the edge: one observation in flight, each sent at the
    first control-period boundary after the previous reply."""
    n = tmap.observation_specs()[0].shape[0]
    arrays = {s.name: np.zeros(s.shape, s.dtype) for s in tmap.observation_specs()}
    hello = bridge_pb2.Hello(policy=MODEL, source="bench:session",
                             observation_spec=[s.to_proto() for s in tmap.observation_specs()],
                             action_spec=[s.to_proto() for s in tmap.action_specs()])
    rtt, gw, infer = [], [], []
    async with grpc.aio.insecure_channel(gateway) as channel:
        call = bridge_pb2_grpc.BridgeStub(channel).Connect()
        await call.write(bridge_pb2.ClientMessage(hello=hello))
        await call.read()
        t0 = time.perf_counter()
        measure_from, end, step = t0 + warmup, t0 + warmup + seconds, 0
        while (now := time.perf_counter()) < end:
            arrays["joint_position"] = encode_seq(step, n).astype(np.float32)
            t_send = time.perf_counter_ns()
            obs = bridge_pb2.Observation(step=step, t_sent_ns=time.time_ns(), tensors=encode_all(arrays),
                                         step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID)
            await call.write(bridge_pb2.ClientMessage(observation=obs))
            reply = await call.read()
            done = time.perf_counter_ns()
            if reply.WhichOneof("kind") != "action":
                raise RuntimeError(f"session step {step}: {reply}")
            if now >= measure_from:
                tm = reply.action.timing
                rtt.append(done - t_send)
                gw.append(tm.gateway_send_ns - tm.gateway_recv_ns)
                infer.append(tm.infer_end_ns - tm.infer_start_ns)
            step += 1
            if rate is not None:
                period = 1.0 / rate
                now = time.perf_counter()
                await asyncio.sleep((period - (now - t0) % period) if now > t0 else 0.0)
        await call.done_writing()
    return {**percentiles(rtt), "gateway": percentiles(gw), "inference": percentiles(infer)}


def run_session(gateway: str, tmap: TopicMap, rate: float | None, a: argparse.Namespace) -> dict:
    label = "grpc.aio session back to back" if rate is None else f"{rate:g} Hz grpc.aio session, paced"
    result = asyncio.run(session(gateway, tmap, rate=rate, seconds=a.seconds, warmup=a.warmup))
    print(f"  {label}: round trip p50 {result['p50']:.3f} ms (in gateway {result['gateway']['p50']:.3f}, "
          f"of it inference {result['inference']['p50']:.3f})", flush=True)
    return result


def run_edge(robot: Robot, gateway: str, domain: int, rate: float, a: argparse.Namespace, logs: Path) -> dict:
    log_path = logs / f"edge_{rate:g}hz.log"
    cmd = [sys.executable, "-m", "tether", "edge", "--gateway", gateway, "--topic-map", str(a.topic_map),
           "--transport", "dds", "--domain-id", str(domain), "--rate", f"{rate:g}", "--policy", MODEL,
           "--node-name", "bench_edge", "--status-s", "3600"]
    result = block(robot, cmd, log_path, rate=rate, a=a, label=f"{rate:g} Hz edge+gateway+Triton")
    lines = [x for x in log_path.read_text().splitlines() if x.endswith("stopped")]
    m = re.search(r"rtt p50/p99 ([\d.]+)/([\d.]+) ms(?: \(p50 in gateway ([\d.]+), of it inference ([\d.]+)\))?",
                  lines[-1]) if lines else None
    result["edge_rtt_ms"] = {"p50": float(m[1]), "p99": float(m[2]),
                             "gateway_p50": float(m[3]) if m[3] else None,
                             "inference_p50": float(m[4]) if m[4] else None} if m else None
    result["edge_status"] = lines[-1] if lines else None
    return result


def run_raw(robot: Robot, domain: int, rate: float, a: argparse.Namespace, logs: Path) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--echo", "--domain-id", str(domain),
           "--topic-map", str(a.topic_map)]
    return block(robot, cmd, logs / f"echo_{rate:g}hz.log", rate=rate, a=a, label=f"{rate:g} Hz raw DDS ping-pong")


def echo(domain: int, topic_map: Path) -> None:
    """The baseline peer: each JointState answered at once, in the receive callback."""
    tmap = load_topic_map(topic_map)
    obs, act = tmap.observation[0], tmap.action[0]
    first, action = tmap.observation_specs()[0].name, tmap.action_specs()[0].name
    stop, parent = threading.Event(), os.getppid()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with DdsTransport(domain_id=domain, node_name="bench_echo") as transport:
        publish = transport.publisher(act.topic, act.type, reliable=act.reliable)

        def answer(msg) -> None:
            arrays = tmap.observation_arrays({obs.topic: msg})
            for _, command in tmap.commands({action: arrays[first]}):
                publish(command)

        transport.subscribe(obs.topic, obs.type, answer, reliable=obs.reliable)
        while not stop.wait(0.2) and os.getppid() == parent:
            transport.raise_if_failed()


def check_topic_map(tmap: TopicMap) -> None:
    obs, act = tmap.observation_specs(), tmap.action_specs()
    names = [s.name for s in obs]
    if tmap.observation[0].type != messages.JOINT_STATE or names != ["joint_position", "joint_velocity"] \
            or len(act) != 1 or act[0].shape != obs[0].shape or obs[0].shape[0] < 2:
        raise SystemExit("this benchmark needs the default topic map's shape: JointState -> joint_position[n], "
                         "joint_velocity[n] -> one action[n], n >= 2")


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="100,500", help="comma-separated Hz: robot publish rate = edge rate")
    p.add_argument("--seconds", type=float, default=6.0, help="measured seconds per rate and path")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds after the first answer, not measured")
    p.add_argument("--domain-id", type=int, default=random.SystemRandom().randrange(1, 233))
    p.add_argument("--topic-map", type=Path, default=DEFAULT_TOPIC_MAP)
    p.add_argument("--echo", action="store_true", help=argparse.SUPPRESS)  # the baseline's peer process
    p.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "ros2_edge.json")
    a = p.parse_args(argv)
    os.environ["CYCLONEDDS_URI"] = loopback_config(a.domain_id)  # before any participant, children inherit
    os.environ["ROS_DOMAIN_ID"] = str(a.domain_id)
    if a.echo:
        echo(a.domain_id, a.topic_map)
        return None
    signal.signal(signal.SIGTERM, _interrupt)  # unwind: every child is stopped on the way out
    tmap = load_topic_map(a.topic_map)
    check_topic_map(tmap)
    rates = [float(x) for x in a.rates.split(",")]
    run_dir = Path(tempfile.mkdtemp(prefix="tether-bench-ros2-"))
    obs_spec, act_spec = tmap.observation_specs(), tmap.action_specs()
    ModelRepository(run_dir / "models").write_version(MODEL, 1, EchoPolicy(obs_spec[0].shape[0]), obs_spec, act_spec)
    print(f"run dir {run_dir}; DDS domain {a.domain_id} on loopback only", flush=True)
    rows = []
    with TritonServer(run_dir / "models", models=[MODEL], log_path=run_dir / "triton.log") as triton, \
            gateway_process(triton_url=triton.grpc_url, policy=MODEL, log_path=run_dir / "gateway.log") as gw:
        print(f"triton {triton.version} on {triton.grpc_url}, gateway {gw}", flush=True)
        robot = Robot(a.domain_id, tmap)
        try:
            back_to_back = run_session(gw, tmap, None, a)
            for rate in rates:
                raw = run_raw(robot, a.domain_id, rate, a, run_dir)
                edge = run_edge(robot, gw, a.domain_id, rate, a, run_dir)
                paced = run_session(gw, tmap, rate, a)
                rows.append({"rate_hz": rate, "raw_dds": raw, "edge": edge, "session_paced": paced,
                             "ratio_p50": _ratio(edge["p50"], raw["p50"]),
                             "ratio_p99": _ratio(edge["p99"], raw["p99"])})
        finally:
            robot.close()
        version = triton.version
    result = {"machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
              "triton_version": version, "domain_id": a.domain_id, "seconds": a.seconds, "warmup_s": a.warmup,
              "topic_map": str(a.topic_map), "policy": "action = joint_position + 0 x MLP(64, 64)",
              "method": " ".join(next(x for x in __doc__.split("\n\n") if x.startswith("Matching")).split()),
              "rates": rows, "session_back_to_back": back_to_back, "logs": str(run_dir)}
    print_table(result)
    write_json(a.json, result)
    print(f"wrote {a.json}")
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def print_table(r: dict) -> None:
    print(f"\n{'rate':>7}  {'path':<24}{'p50 ms':>9}{'p99 ms':>9}{'n':>7}{'answered':>10}"
          f"{'ratio p50':>11}{'ratio p99':>11}")
    for row in r["rates"]:
        for name, key in (("raw DDS ping-pong", "raw_dds"), ("edge+gateway+Triton", "edge")):
            x = row[key]
            ratio = ("1.00", "1.00") if key == "raw_dds" else (f"{row['ratio_p50']}", f"{row['ratio_p99']}")
            print(f"{row['rate_hz']:>4g} Hz  {name:<24}{x['p50'] or float('nan'):>9.3f}{x['p99'] or float('nan'):>9.3f}"
                  f"{x['n']:>7}{x['answered']:>10.0%}{ratio[0]:>11}{ratio[1]:>11}")
    b2b = r.get("session_back_to_back")
    print("\nobservation -> action round trip through the gateway, p50/p99 ms (p50 inside the gateway; "
          "of it Triton's inference)")
    print(f"{'rate':>7}  {'edge node (whole run)':<34}{'grpc.aio session, same pacing':<34}"
          f"{'grpc.aio session, back to back':<34}")
    for row in r["rates"]:
        rtt, paced = row["edge"]["edge_rtt_ms"], row.get("session_paced")
        edge_text = "-" if not rtt else f"{rtt['p50']:.2f}/{rtt['p99']:.2f}"
        if rtt and rtt.get("gateway_p50") is not None:
            edge_text += f" ({rtt['gateway_p50']:.2f}; {rtt['inference_p50']:.2f})"
        print(f"{row['rate_hz']:>4g} Hz  {edge_text:<34}{_session_text(paced):<34}{_session_text(b2b):<34}")


def _session_text(x: dict | None) -> str:
    if not x or x.get("p50") is None:
        return "-"
    return f"{x['p50']:.2f}/{x['p99']:.2f} ({x['gateway']['p50']:.2f}; {x['inference']['p50']:.2f})"


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted: every child process was stopped")
