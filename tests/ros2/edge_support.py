"""Real pieces for the edge-node tests: echo policies for Triton (a tritonserver of the test's own serving them),
a gateway on its own event-loop thread (stoppable and restartable on its port), and the robot process
(tests/ros2/edge_robot.py).

    with echo_gateway(tmp_path_factory.mktemp("estop")) as gw:     # "echo6" served, a GatewayThread started
        yield gw.address
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from bridge.app import GatewayApp
from bridge.common.processes import stop_group
from bridge.gateway.config import GatewayConfig
from bridge.ros2.dds import DdsTransport
from bridge.ros2.edge_config import EdgeConfig, guard_config
from bridge.ros2.node import EdgeNode
from bridge.ros2.release_auth import add_operator
from inference_server import ModelRepository, TritonServer
from protos.codec import Spec
from tests.support import waiting

ROOT = Path(__file__).resolve().parents[2]
ROBOT = Path(__file__).with_name("edge_robot.py")
FASTDDS_PEER = ROOT / "tests" / "peers" / "build" / "fastdds_peer"


class EchoVelocity(torch.nn.Module):
    """action = joint_velocity: the robot chooses the policy's action through what it publishes."""

    def forward(self, joint_position: torch.Tensor, joint_velocity: torch.Tensor) -> torch.Tensor:
        return joint_velocity * 1.0


class EchoPosition(torch.nn.Module):
    """action = joint_position."""

    def forward(self, joint_position: torch.Tensor, joint_velocity: torch.Tensor) -> torch.Tensor:
        return joint_position * 1.0


def joint_specs(n: int) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    obs = (Spec("joint_position", np.float32, (n,)), Spec("joint_velocity", np.float32, (n,)))
    return obs, (Spec("action", np.float32, (n,)),)


# tests.support.waiting's, polling every 5 ms: a command period of the edge node is 10 ms
wait_until = functools.partial(waiting.wait_until, period=0.005)


@contextlib.contextmanager
def serving(folder: Path, **models: tuple[torch.nn.Module, int]) -> Iterator[TritonServer]:
    """A tritonserver of its own serving `models` (name=(module, joints): v1 of each, on `joint_specs(joints)`),
    its repository and log in `folder`."""
    repo = ModelRepository(folder / "models")
    for name, (module, joints) in models.items():
        repo.write_version(name, 1, module, *joint_specs(joints))
    with TritonServer(repo.root, models=list(models), log_path=folder / "triton.log") as server:
        yield server


class GatewayThread:
    """`bridge.app.GatewayApp` served from an asyncio loop on its own thread."""

    def __init__(self, triton_url: str, **config):
        self.triton_url, self.config = triton_url, config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-gateway", daemon=True)
        self.thread.start()
        self.gateway: GatewayApp | None = None
        self.port = 0
        self.address = ""

    def _call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> str:
        """Serve (on the same port as before after a `stop`); returns HOST:PORT."""
        async def start():
            gateway = GatewayApp(GatewayConfig(triton_url=self.triton_url, port=self.port, **self.config))
            await gateway.start()
            return gateway

        self.gateway = self._call(start())
        self.address = self.gateway.address
        self.port = int(self.address.rpartition(":")[2])
        return self.address

    def stop(self) -> None:
        """Stop at once (grace 0): every open stream is cancelled, as when the process dies."""
        if self.gateway is not None:
            self._call(self.gateway.stop(grace=0))
            self.gateway = None

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


@contextlib.contextmanager
def echo_gateway(folder: Path, **config) -> Iterator[GatewayThread]:
    """A started GatewayThread (`config`: GatewayConfig's fields) in front of a tritonserver of its own (`serving`,
    in `folder`) serving "echo6", EchoVelocity for the default topic map's 6 joints; closed on exit."""
    with serving(folder, echo6=(EchoVelocity(), 6)) as triton:
        gateway = GatewayThread(triton.grpc_url, **config)
        try:
            gateway.start()
            yield gateway
        finally:
            gateway.close()


class Robot:
    """The robot process; its command records (dicts with t, data, lat_ms) collect in `commands`."""

    def __init__(self, domain: int, joints: tuple[str, ...], *, hz: float = 100.0, argv: list[str] | None = None,
                 env: dict[str, str] | None = None):
        """The Cyclone DDS robot (edge_robot.py), or the process `argv` (e.g. rclpy_robot.py) in `env`."""
        env = env or {**os.environ, "PYTHONPATH": str(ROOT)}
        argv = argv or [sys.executable, str(ROBOT), "--domain", str(domain), "--joints", ",".join(joints),
                        "--hz", str(hz)]
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.commands: list[dict] = []
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            record = json.loads(line)
            if "event" in record:
                self._events.put(record["event"] if "data" not in record else f"{record['event']} {record['data']}")
            else:
                self.commands.append(record)

    def wait_ready(self, timeout: float = 20.0) -> None:
        self.wait_event("ready", timeout=timeout)

    def wait_event(self, name: str, *, timeout: float = 20.0) -> None:
        """Wait for the event `name` (other events before it are dropped)."""
        deadline = time.monotonic() + timeout
        try:
            while self._events.get(timeout=max(deadline - time.monotonic(), 0.001)) != name:
                pass
        except queue.Empty:
            raise AssertionError(f"robot: no {name!r} in {timeout} s: {self.stderr()}") from None

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.poll() is not None else "(still running)"

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def since(self, t: float) -> list[dict]:
        return [c for c in list(self.commands) if c["t"] >= t]

    def wait_for(self, predicate, *, after: float, timeout: float, what: str) -> dict:
        """The first command after monotonic time `after` whose data satisfies `predicate`."""
        def find():
            return next((c for c in self.since(after) if predicate(np.array(c["data"]))), None)
        return wait_until(find, timeout=timeout, what=what)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.returncode == 0, self.proc.stderr.read()


def const(robot: Robot, value: float, *, timeout: float = 10.0, what: str = "") -> dict:
    """Make the echo policy's action `value` everywhere (the robot's velocities); the first command carrying it
    (`what`: that command, as a timeout names it)."""
    t = time.monotonic()
    robot.send(f"const {value}")
    return robot.wait_for(lambda d: np.allclose(d, value, atol=1e-6), after=t, timeout=timeout,
                          what=what or f"a command of {value}")


class FastDdsRobot:
    """The C++ robot on Fast DDS 2.9 (tests/peers/fastdds_peer, interop mode) as a process: JointStates
    at `hz` (joints shoulder, elbow, wrist; position [0.5, -1.25, 0.001 * i]), and every command it
    receives, with its arrival time here (time.monotonic()), in `commands` as (t, data)."""

    def __init__(self, domain: int, *, hz: float = 100.0, timeout_s: float = 600.0):
        self.proc = subprocess.Popen([str(FASTDDS_PEER), "--domain", str(domain), "--count", "100000000",
                                      "--timeout", str(timeout_s), "--hz", str(hz)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.commands: list[tuple[float, list[float]]] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            record = json.loads(line)
            if "data" in record:
                self.commands.append((time.monotonic(), record["data"]))

    def since(self, t: float) -> list[list[float]]:
        return [data for ts, data in list(self.commands) if ts >= t]

    def wait_moving(self, *, after: float, n: int = 20, timeout: float = 30.0) -> float:
        """Wait for `n` commands after `after` that each differ from the one before (the robot moves);
        returns the arrival time of the last of them."""
        def moving():
            recent = [(ts, data) for ts, data in list(self.commands) if ts >= after]
            moves = [ts for (_, a), (ts, b) in zip(recent, recent[1:], strict=False) if a != b]
            return moves[n - 1] if len(moves) >= n else None
        return wait_until(moving, timeout=timeout, what=f"{n} moving commands on the Fast DDS robot")

    def close(self) -> None:
        stop_group(self.proc, grace_s=10)


def release_token(folder: Path, operator: str = "ada") -> tuple[Path, str]:
    """A node's release tokens file in `folder` giving `operator` a token: (the file, the token)."""
    path = folder / "release_tokens.json"
    return path, add_operator(path, operator)


@contextlib.contextmanager
def running_edge(domain: int, address: str, topic_map, *, policy: str, rate_hz: float = 100.0,
                 transport=None, config: dict | None = None, **guard):
    """An `EdgeNode` named "edge_under_test" on its own DDS participant (or the given transport),
    started and stopped. No local release unless `config` names `release_tokens` (see
    `release_token`); no velocity limit unless the test sets one (these tests check the pipeline;
    test_guard.py and test_edge_guard.py check the limits)."""
    guard.setdefault("deadline_s", 0.05)
    guard.setdefault("velocity_limit", math.inf)
    own = transport is None
    transport = DdsTransport(domain_id=domain, node_name="edge_under_test") if own else transport
    settings = {"backoff_s": (0.05, 0.5), **(config or {})}
    node = EdgeNode(config=EdgeConfig(gateway=address, rate_hz=rate_hz, policy=policy, node_name="edge_under_test",
                                      **settings),
                    topic_map=topic_map, transport=transport, guard=guard_config(topic_map, **guard))
    try:
        node.start()
        yield node
        node.stop()
    finally:
        if node.running:
            node.stop()
        if own:
            transport.close()
