"""Cameras end to end: a robot on DDS publishes a driver's `CompressedImage` (JPEG bytes) and a raw bgr8 `Image`
through the real edge node (which forwards the first untouched and resizes and encodes the second), a real
gateway (decoding in its pool, logging the compressed bytes) and a real tritonserver serving `PixelDigest`, a
policy whose action is a digest of the pixels it was given. The digest of decoding the same bytes here
(protos.codec) must equal it exactly; a corrupt JPEG is a StepError for its steps only; a camera whose
declared shape is not the policy's is refused at Hello, before anything moves.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess
import threading

import grpc
import numpy as np
import pytest
import torch
from PIL import Image

from bridge.experience import read_transitions
from bridge.experience.tool import export
from bridge.gateway.session import session as gateway_session
from bridge.ros2 import messages
from bridge.ros2.dds import DdsTransport
from bridge.ros2.topic_map import parse_topic_map
from bridge.ros2.transport import wait_for_subscribers
from inference_server import ModelRepository, TritonServer
from protos import bridge_pb2
from protos.codec import JPEG, Spec, decode
from protos.tether.v1 import tensor_pb2
from tests.gateway.helpers import RawSession, hello
from tests.ros2.edge_support import GatewayThread, running_edge, wait_until
from tests.ros2.ros_env import ROOT, ROS_PYTHON, needs_rclpy, ros_env

JOINTS = [f"j{i}" for i in range(6)]
WRIST, FRONT, FRONT_RAW = (40, 48, 3), (32, 40, 3), (64, 80, 3)  # sums of 7 * 255 * pixels stay exact in float32
COMMANDS = "/policy_controller/commands"
POLICY_OBS = (Spec("wrist", np.uint8, WRIST), Spec("front", np.uint8, FRONT))
POLICY_ACT = (Spec("action", np.float32, (6,)),)


def topic_map(wrist_shape=WRIST):
    return parse_topic_map({
        "observation": [
            {"topic": "/joint_states", "type": "sensor_msgs/msg/JointState", "joints": JOINTS,
             "tensors": {"joint_position": {"field": "position"}}},
            {"topic": "/wrist/image/compressed", "type": "sensor_msgs/msg/CompressedImage",
             "tensors": {"wrist": {"field": "image", "shape": list(wrist_shape), "format": "jpeg"}}},
            {"topic": "/front/image_raw", "type": "sensor_msgs/msg/Image",
             "tensors": {"front": {"field": "image", "shape": list(FRONT),
                                   "encode": {"format": "jpeg", "quality": 90, "resize": list(FRONT[:2])}}}}],
        "action": [{"topic": COMMANDS, "type": "std_msgs/msg/Float64MultiArray", "joints": JOINTS,
                    "tensors": {"action": {"field": "data", "bounds": [-1e8, 1e8]}}}]})


class PixelDigest(torch.nn.Module):
    """action = (sum, position-weighted sum, one pixel) of each camera's uint8 frame, as float32."""

    def forward(self, wrist: torch.Tensor, front: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.digest(wrist), self.digest(front)], dim=1)

    def digest(self, image: torch.Tensor) -> torch.Tensor:
        x = image.to(torch.float32)
        weights = (torch.arange(x[0].numel()) % 7 + 1).to(torch.float32).reshape(x.shape[1:])
        return torch.stack([x.sum(dim=(1, 2, 3)), (x * weights).sum(dim=(1, 2, 3)), x[:, 3, 5, 1]], dim=1)


def digest(image: np.ndarray) -> list[float]:
    """`PixelDigest.digest` of one frame, here (exact: integers below 2**24)."""
    x = image.astype(np.float64)
    weights = (np.arange(x.size) % 7 + 1).reshape(x.shape)
    return [x.sum(), (x * weights).sum(), x[3, 5, 1]]


def scene(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A camera-like frame: gradients, a box and sensor noise, different for every seed."""
    rng = np.random.default_rng(seed)
    h, w, _ = shape
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([200 * x / w, 200 * y / h, np.full((h, w), 40.0)], axis=-1) + rng.normal(0, 6, shape)
    top, left = rng.integers(0, h // 2), rng.integers(0, w // 2)
    img[top:top + h // 3, left:left + w // 3] = rng.integers(0, 255, 3)
    return np.clip(img, 0, 255).astype(np.uint8)


def driver_jpeg(seed: int) -> bytes:
    """What a camera driver sends: a JPEG from another encoder than the gateway's (Pillow's)."""
    out = io.BytesIO()
    Image.fromarray(scene(WRIST, seed)).save(out, "JPEG", quality=85)
    return out.getvalue()


class CameraRobot:
    """The robot: its own DDS participant publishing joint states and both cameras, recording the commands."""

    def __init__(self, domain: int):
        self.transport = DdsTransport(domain_id=domain, node_name="camera_robot")
        self.commands: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.transport.subscribe(COMMANDS, messages.FLOAT64_ARRAY, self._command, reliable=True)
        self.joints = self.transport.publisher("/joint_states", messages.JOINT_STATE, reliable=False)
        self.wrist = self.transport.publisher("/wrist/image/compressed", messages.COMPRESSED_IMAGE, reliable=False)
        self.front = self.transport.publisher("/front/image_raw", messages.IMAGE, reliable=False)

    def _command(self, msg) -> None:
        with self._lock:
            self.commands.append(np.array(msg.data, np.float64))

    def publish(self, jpeg: bytes, front_rgb: np.ndarray) -> None:
        self.joints(messages.joint_state(names=JOINTS, position=np.zeros(6)))
        self.wrist(messages.compressed_image(jpeg, format="rgb8; jpeg compressed bgr8"))
        bgr = messages.image(np.ascontiguousarray(front_rgb[:, :, ::-1]))
        bgr.encoding = "bgr8"
        self.front(bgr)

    def command_starting(self, prefix: list[float]) -> list[float] | None:
        """The first command whose first three values are `prefix` (the wrist camera's digest)."""
        with self._lock:
            return next((c.tolist() for c in self.commands if np.array_equal(c[:3], prefix)), None)

    def close(self) -> None:
        self.transport.close()


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cameras")
    repo = ModelRepository(folder / "models")
    repo.write_version("digest", 1, PixelDigest(), POLICY_OBS, POLICY_ACT)
    with TritonServer(repo.root, models=["digest"], log_path=folder / "triton.log") as server:
        yield server


@pytest.fixture
def gateway(triton, tmp_path):
    gw = GatewayThread(triton.grpc_url, experience_dir=tmp_path / "experience", decode_threads=2)
    gw.start()
    yield gw
    gw.close()


@pytest.fixture
def robot(ros_domain):
    robot = CameraRobot(ros_domain)
    yield robot
    robot.close()


@pytest.fixture
def replies(monkeypatch):
    """Every (observation, reply) the gateway's sessions handle."""
    seen: list[tuple[bridge_pb2.Observation, bridge_pb2.ServerMessage]] = []
    handle = gateway_session.Session.handle

    async def spy(self, obs):
        reply = await handle(self, obs)
        seen.append((obs, reply))
        return reply

    monkeypatch.setattr(gateway_session.Session, "handle", spy)
    return seen


def test_the_policy_sees_exactly_the_decoded_pixels_and_the_log_keeps_the_jpeg(ros_domain, robot, gateway,
                                                                                tmp_path):
    jpegs = [driver_jpeg(seed) for seed in range(3)]
    fronts = [scene(FRONT_RAW, 100 + seed) for seed in range(3)]
    with running_edge(ros_domain, gateway.address, topic_map(), policy="digest") as node:
        assert wait_for_subscribers(robot.wrist, timeout=10), "the edge never subscribed to the wrist camera"
        for jpeg, front in zip(jpegs, fronts, strict=True):
            expected = digest(decode_jpeg(jpeg))       # decoding the driver's bytes here, as the gateway must

            def commanded(jpeg=jpeg, front=front, expected=expected):
                robot.publish(jpeg, front)             # best effort: again until its digest comes back
                return robot.command_starting(expected)
            wait_until(commanded, timeout=30, what=f"a command carrying the digest {expected} of the wrist JPEG")
        assert node.stats.connects == 1 and not node.stats.errors, node.stats.errors
    log_dir = tmp_path / "experience"
    logged = wait_until(lambda: list(read_transitions(log_dir)) or None, timeout=10,
                        what="transitions in the gateway's log")
    published = set(jpegs)
    for t in logged:
        cams = {x.name: x for x in t.observation}
        assert {cams["wrist"].encoding, cams["front"].encoding} == {JPEG}
        assert cams["wrist"].data in published                        # the driver's bytes, untouched
        assert cams["front"].data[:2] == b"\xff\xd8" and len(cams["front"].data) < np.prod(FRONT)  # a JPEG
        action = decode(t.action[0]).astype(np.float64)
        assert action.tolist() == digest(decode(cams["wrist"])) + digest(decode(cams["front"]))   # exactly
        red, _, blue = decode(cams["front"]).reshape(-1, 3).mean(axis=0)
        assert red > blue + 30, "bgr8 was not read as RGB"            # the scene's red ramp vs its flat blue
    raw_log = b"".join(p.read_bytes() for p in log_dir.rglob("*") if p.is_file())   # segments, uncompressed
    for t in logged[:5]:
        wrist = next(x for x in t.observation if x.name == "wrist")
        assert wrist.data in raw_log, "the log file lacks the JPEG bytes"
        assert decode(wrist).tobytes() not in raw_log, "the log file holds raw pixels"
    info = export(log_dir, tmp_path / "dataset")                     # `tether log export`: arrays
    assert info["features"]["observation.wrist"] == {"dtype": "uint8", "shape": list(WRIST)}
    episode = np.load(next((tmp_path / "dataset").rglob("*.npz")))
    by_step = {t.step: t for t in logged}
    for row, step in enumerate(episode["step"]):
        cams = {x.name: x for x in by_step[int(step)].observation}
        assert np.array_equal(episode["observation.wrist"][row], decode(cams["wrist"]))
        assert np.array_equal(episode["observation.front"][row], decode(cams["front"]))


@needs_rclpy
def test_an_rclpy_robots_cameras_reach_the_policy_through_the_edge(ros_domain, gateway, tmp_path):
    """The same through ROS 2 itself: rclpy's CompressedImage and bgr8 Image (Fast DDS) to the edge (Cyclone DDS)."""
    robot = subprocess.Popen([str(ROS_PYTHON), str(ROOT / "tests" / "ros2" / "rclpy_camera_robot.py"), "--joints",
                              ",".join(JOINTS), "--hz", "50"], env=ros_env(ros_domain), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[dict] = []
    threading.Thread(target=lambda: [lines.append(json.loads(x)) for x in robot.stdout if x.startswith("{")],
                     daemon=True).start()
    try:
        with running_edge(ros_domain, gateway.address, topic_map(), policy="digest") as node:
            for seed in (11, 12):
                jpeg, npy = tmp_path / f"wrist{seed}.jpg", tmp_path / f"front{seed}.npy"
                jpeg.write_bytes(driver_jpeg(seed))
                np.save(npy, scene(FRONT_RAW, seed))
                robot.stdin.write(f"frame {jpeg} {npy}\n")
                robot.stdin.flush()
                expected = digest(decode_jpeg(jpeg.read_bytes()))
                wait_until(lambda expected=expected: any(x.get("data", [])[:3] == expected for x in list(lines)),
                           timeout=60, what=f"the rclpy robot receiving the digest {expected} of its JPEG")
            assert node.stats.connects == 1 and not node.stats.errors, node.stats.errors
    finally:
        robot.stdin.close()
        try:
            robot.wait(timeout=15)
        except subprocess.TimeoutExpired:
            robot.kill()
            robot.wait()
    assert robot.returncode == 0, robot.stderr.read()


def test_a_corrupt_jpeg_is_a_step_error_and_the_session_goes_on(ros_domain, robot, gateway, replies):
    good, later = driver_jpeg(7), driver_jpeg(8)
    corrupt = good[:-100]                  # cut short on the wire: its header whole, its pixels not
    front = scene(FRONT_RAW, 9)
    with running_edge(ros_domain, gateway.address, topic_map(), policy="digest") as node:
        assert wait_for_subscribers(robot.wrist, timeout=10)
        for jpeg in (good, corrupt, later):
            if jpeg is corrupt:
                def refused():
                    robot.publish(corrupt, front)
                    return node.stats.errors.get("INVALID_OBSERVATION")
                wait_until(refused, timeout=30, what="a StepError for the corrupt JPEG at the edge")
                continue
            expected = digest(decode_jpeg(jpeg))

            def commanded(jpeg=jpeg, expected=expected):
                robot.publish(jpeg, front)
                return robot.command_starting(expected)
            wait_until(commanded, timeout=30, what=f"a command for the digest {expected}")
        assert node.stats.connects == 1, "the session was replaced"
    bad = [(obs, reply) for obs, reply in replies if obs.tensors[1].data == corrupt]
    assert bad and all(reply.WhichOneof("kind") == "error" for _, reply in bad)
    for _, reply in bad:
        assert reply.error.code == bridge_pb2.StepError.INVALID_OBSERVATION and reply.error.field == "wrist"
        assert "wrist: corrupt JPEG" in reply.error.message and "Premature end" in reply.error.message
    errors = [reply for _, reply in replies if reply.WhichOneof("kind") == "error"]
    assert len(errors) == len(bad), "a good frame got a StepError"
    assert node.stats.errors["INVALID_OBSERVATION"] == len(bad)
    after = [reply.WhichOneof("kind") for obs, reply in replies if obs.tensors[1].data == later]
    assert "action" in after and set(after) <= {"action", "episode_end"}, after     # LAST: the edge stopped


def test_a_camera_shape_that_disagrees_with_the_policy_is_refused_at_hello(ros_domain, robot, gateway, caplog):
    with caplog.at_level(logging.WARNING, logger="tether.edge.link"), \
            running_edge(ros_domain, gateway.address, topic_map(wrist_shape=(48, 40, 3)), policy="digest") as node:
        robot.publish(driver_jpeg(0), scene(FRONT_RAW, 0))
        refusal = wait_until(lambda: next((r.getMessage() for r in caplog.records if "reconnecting" in
                                           r.getMessage()), None), timeout=30, what="the refused Hello")
        assert node.stats.connects == 0 and not gateway.gateway.sessions
    assert "'wrist' (JPEG) is uint8[48, 40, 3], policy 'digest' takes uint8[40, 48, 3]" in refusal, refusal
    assert not robot.commands, "a command reached the robot"


def test_encoded_cameras_are_refused_in_vectorised_sessions(gateway):
    cams = (Spec("wrist", np.uint8, WRIST, encoding=JPEG), Spec("front", np.uint8, FRONT, encoding=JPEG))
    vector = hello(obs=cams, act=POLICY_ACT, policy="digest")
    vector.num_envs = 2

    async def connect():
        async with RawSession(gateway.address, vector):
            pass

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        asyncio.run(connect())
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "['front', 'wrist']: encoded images (JPEG, PNG) are not taken in vectorised sessions" in \
        refused.value.details()


def decode_jpeg(data: bytes) -> np.ndarray:
    """The wrist camera's JPEG decoded as the gateway decodes it (protos.codec), for the digests."""
    return decode(tensor_pb2.Tensor(name="wrist", dtype=tensor_pb2.UINT8, shape=WRIST, data=data, encoding=JPEG))
