"""ROS 2 wire interop: Cyclone DDS (Python) <-> a C++ peer on Fast DDS 2.9, ROS 2's default DDS.

The peer (tests/peers/fastdds_peer.cpp, built by tests/peers/setup.sh) publishes JointState on
rt/joint_states and echoes each Float64MultiArray it receives on rt/policy_controller/commands as
one JSON line. Both sides are pinned to loopback; each test gets its own domain id.

The Cyclone side here is cyclonedds' own IDL structs, independent of Tether's message code; the
edge node's transport against this peer is in test_dds.py, the whole edge node in test_edge.py.
"""

import json
import os
import queue
import random
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

PEER = Path(__file__).resolve().parents[1] / "peers" / "build" / "fastdds_peer"
if not os.access(PEER, os.X_OK):
    pytest.skip(f"Fast DDS peer not built ({PEER}): run `bash tests/peers/setup.sh` "
                "(needs apt packages libfastrtps-dev libfastcdr-dev g++)", allow_module_level=True)

from cyclonedds.core import Policy, Qos  # noqa: E402
from cyclonedds.domain import DomainParticipant  # noqa: E402
from cyclonedds.idl import IdlStruct  # noqa: E402
from cyclonedds.idl.types import float64, int32, sequence, uint32  # noqa: E402
from cyclonedds.pub import DataWriter  # noqa: E402
from cyclonedds.sub import DataReader  # noqa: E402
from cyclonedds.topic import Topic  # noqa: E402
from cyclonedds.util import duration  # noqa: E402

LOOPBACK_CONFIG = """<CycloneDDS><Domain Id="any">
  <General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces>
    <AllowMulticast>false</AllowMulticast></General>
  <Discovery><ParticipantIndex>auto</ParticipantIndex><MaxAutoParticipantIndex>20</MaxAutoParticipantIndex>
    <Peers><Peer address="127.0.0.1"/></Peers></Discovery>
</Domain></CycloneDDS>"""


# -- the ROS 2 messages, as Cyclone IDL structs with the ROS 2 DDS type names -------------------

@dataclass
class Time_(IdlStruct, typename="builtin_interfaces::msg::dds_::Time_"):
    sec: int32
    nanosec: uint32


@dataclass
class Header_(IdlStruct, typename="std_msgs::msg::dds_::Header_"):
    stamp: Time_
    frame_id: str


@dataclass
class JointState_(IdlStruct, typename="sensor_msgs::msg::dds_::JointState_"):
    header: Header_
    name: sequence[str]
    position: sequence[float64]
    velocity: sequence[float64]
    effort: sequence[float64]


@dataclass
class MultiArrayDimension_(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayDimension_"):
    label: str
    size: uint32
    stride: uint32


@dataclass
class MultiArrayLayout_(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayLayout_"):
    dim: sequence[MultiArrayDimension_]
    data_offset: uint32


@dataclass
class Float64MultiArray_(IdlStruct, typename="std_msgs::msg::dds_::Float64MultiArray_"):
    layout: MultiArrayLayout_
    data: sequence[float64]


# ROS 2 default QoS (reliable, volatile, keep last 10), and XCDR1 as ROS 2 writes it.
ROS_QOS = Qos(Policy.Reliability.Reliable(max_blocking_time=duration(milliseconds=100)),
              Policy.Durability.Volatile, Policy.History.KeepLast(10),
              Policy.DataRepresentation(use_cdrv0_representation=True))


# -- helpers ------------------------------------------------------------------------------------

class Peer:
    """The C++ peer as a bounded subprocess; its stdout lines arrive as parsed JSON on a queue."""

    def __init__(self, domain: int, *, count: int, timeout_s: float):
        self.proc = subprocess.Popen(
            [str(PEER), "--domain", str(domain), "--count", str(count), "--timeout", str(timeout_s)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def next(self, deadline: float, **match) -> dict:
        """The next line whose keys equal `match` (others are skipped), before `deadline`."""
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if all(msg.get(k) == v for k, v in match.items()):
                return msg
        raise AssertionError(f"peer sent no line matching {match} in time (rc={self.proc.poll()}, "
                             f"stderr={self._stderr()!r})")

    def _stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.poll() is not None else ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def wait_until(predicate, deadline: float, what: str, period: float = 0.01):
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(period)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def domain(request, monkeypatch) -> int:
    """A fresh domain id (the suite's `ros_domain` where a conftest provides one), loopback only."""
    try:
        domain_id = request.getfixturevalue("ros_domain")
    except pytest.FixtureLookupError:
        domain_id = random.SystemRandom().randrange(1, 233)
    monkeypatch.setenv("CYCLONEDDS_URI", LOOPBACK_CONFIG)
    return domain_id


# -- the test -----------------------------------------------------------------------------------

def test_joint_states_and_commands_cross_between_fastdds_and_cyclone(domain):
    commands = [
        Float64MultiArray_(MultiArrayLayout_([MultiArrayDimension_("joints", 3, 3)], 0), [0.1, -0.2, 0.3]),
        Float64MultiArray_(MultiArrayLayout_([], 7), [1e-300, 1.7976931348623157e308, -3.141592653589793]),
        Float64MultiArray_(MultiArrayLayout_([MultiArrayDimension_("rows \"x\"", 2, 4),
                                              MultiArrayDimension_("", 2, 2)], 1), [0.0, 1.0, 2.0, 3.0]),
        Float64MultiArray_(MultiArrayLayout_([], 0), []),
    ]
    deadline = time.monotonic() + 20
    # Cyclone first: the peer's initial announcements then find it at once (~20 ms). With the
    # order reversed, Cyclone takes about 0.9 s to discover an already running Fast DDS peer.
    dp = DomainParticipant(domain)
    reader = DataReader(dp, Topic(dp, "rt/joint_states", JointState_), qos=ROS_QOS)
    writer = DataWriter(dp, Topic(dp, "rt/policy_controller/commands", Float64MultiArray_), qos=ROS_QOS)
    peer = Peer(domain, count=len(commands), timeout_s=20)
    try:
        peer.next(deadline, event="ready")

        # Fast DDS -> Cyclone: the peer's JointState, every field intact.
        samples = wait_until(lambda: reader.take(N=10), deadline, "a JointState from the Fast DDS peer")
        for js in samples:
            i = js.header.stamp.sec - 1700000000
            assert 0 <= i < 10_000
            assert js.header.stamp.nanosec == 123456789 and js.header.frame_id == "tether_peer"
            assert list(js.name) == ["shoulder", "elbow", "wrist"]
            assert list(js.position) == [0.5, -1.25, 0.001 * i]
            assert list(js.velocity) == [0.1, 0.2, 0.3] and list(js.effort) == []

        # Cyclone -> Fast DDS: commands, once the peer's reader has matched our writer.
        wait_until(lambda: writer.get_matched_subscriptions(), deadline, "the peer's command reader")
        for cmd in commands:
            writer.write(cmd)
        for cmd in commands:
            echo = peer.next(deadline, event=None, topic="rt/policy_controller/commands")
            assert echo["data"] == cmd.data
            assert echo["layout"]["data_offset"] == cmd.layout.data_offset
            assert [(d["label"], d["size"], d["stride"]) for d in echo["layout"]["dim"]] == \
                [(d.label, d.size, d.stride) for d in cmd.layout.dim]
        done = peer.next(deadline, event="done")
        assert done["reason"] == "count" and done["received"] == len(commands)
        assert peer.proc.wait(timeout=max(deadline - time.monotonic(), 1)) == 0
    finally:
        peer.close()
