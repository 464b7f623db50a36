"""The role the edge node talks to ROS 2 through: subscribe, publish, close.

Two implementations share it: `RclpyTransport` (rclpy, on a robot with ROS 2 installed) and
`DdsTransport` (the ROS 2 wire itself: Cyclone DDS with ROS 2 topic and type names and CDR).
Messages are rosbags message objects (see `bridge.ros2.messages`); callbacks run on the
transport's own receive thread, one at a time. A sample that does not decode, or a callback that
raises, is counted per topic (`transport.delivery_errors`) and logged at most once per topic every
few seconds; delivery goes on, for that topic and every other one (`DeliveryErrors`). Anything
else that stops delivery (a failed take, an exception in the receive loop or the executor) is kept
as a `TransportError` that `raise_if_failed()` raises, and a publish that fails for any reason
raises one: the edge node latches its guard and publishes the safe action on either. Publishing
still works after delivery failed, so that safe action can go out.

The call loop, as the edge node runs it (plain text; the DDS tests run it for real; `open_transport` picks an
implementation: bridge.ros2.transports):

    transport = open_transport("auto", domain_id=0, node_name="tether_edge")
    transport.subscribe("/joint_states", "sensor_msgs/msg/JointState", latest.update)
    command = transport.publisher("/policy_controller/commands", "std_msgs/msg/Float64MultiArray")
    wait_for_subscribers(command, timeout=5.0)
    command(messages.float64_array(action))          # once per control step
    transport.close()

Topic names follow ROS 2 rules; relative names are taken from the root namespace:

    >>> ros_topic("joint_states"), ros_topic("/robot1/cmd_vel")
    ('/joint_states', '/robot1/cmd_vel')
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Protocol

from bridge.common.lifecycle import Closing
from bridge.ros2 import messages

_TOKEN = r"[A-Za-z_][A-Za-z0-9_]*"
_TOPIC = re.compile(rf"/?{_TOKEN}(/{_TOKEN})*")


class TransportError(RuntimeError):
    """A transport that cannot open, publish or deliver; the message names the topic or setting."""


class DeliveryErrors:
    """Samples a transport could not hand over, counted per topic; logged rate-limited, never raised.

        >>> errors = DeliveryErrors(logging.getLogger("doctest"), every_s=60.0)
        >>> errors.record("/joint_states", "undecodable sample", ValueError("short buffer"))
        >>> errors.record("/joint_states", "callback failed", KeyError("x"))
        >>> errors.counts, errors.total
        ({'/joint_states': 2}, 2)
    """

    def __init__(self, log: logging.Logger, *, every_s: float = 5.0):
        self._log, self._every_s = log, every_s
        self._counts: collections.Counter[str] = collections.Counter()
        self._logged: dict[str, float] = {}
        self._lock = threading.Lock()

    def record(self, topic: str, what: str, exc: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            self._counts[topic] += 1
            n = self._counts[topic]
            due = now - self._logged.get(topic, -1e300) >= self._every_s
            if due:
                self._logged[topic] = now
        if due:
            self._log.warning("%s: %s (%s); delivery goes on, %d so far on this topic", topic, what,
                              f"{type(exc).__name__}: {exc}"[:300], n)

    def deliver(self, topic: str, msg_type: str, data: bytes, callback: Callable[[object], None]) -> None:
        """`callback(msg)` with `data` decoded as `msg_type`; a sample that does not decode, or a callback
        that raises, is recorded instead."""
        try:
            msg = messages.deserialize(data, msg_type)
        except Exception as exc:  # a bad sample is counted, never fatal
            self.record(topic, f"undecodable {msg_type} sample", exc)
            return
        try:
            callback(msg)
        except Exception as exc:  # counted; the next sample is delivered as usual
            self.record(topic, "callback failed", exc)

    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


class Publisher(Protocol):
    """Publishes one message per call on the topic it was made for."""

    def __call__(self, msg: object) -> None: ...

    def subscriber_count(self) -> int:
        """How many subscriptions are matched right now (discovery is asynchronous)."""
        ...


class Transport(Protocol):
    """Subscribe to ROS 2 topics and publish on them, with ROS 2 QoS conventions."""

    def subscribe(self, topic: str, msg_type: str, callback: Callable[[object], None], *,
                  reliable: bool = False, depth: int = 10, durable: bool = False) -> None:
        """Call `callback(msg)` for each message; best effort (sensor QoS) unless `reliable`.
        `durable`: transient-local, so what a live durable publisher last wrote arrives even if it
        was written before this subscription (it then matches only durable publishers)."""
        ...

    def publisher(self, topic: str, msg_type: str, *, reliable: bool = True, depth: int = 10,
                  durable: bool = False) -> Publisher:
        """A publisher; reliable keep-last `depth` (the ROS 2 default) unless told otherwise;
        `durable`: transient-local (keeps its last `depth` messages for late subscribers)."""
        ...

    def close(self) -> None:
        """Stop delivering, leave the ROS 2 graph; raises `TransportError` if delivery itself broke
        (a failed take), never for a bad sample or a failing callback (those are counted)."""
        ...

    def raise_if_failed(self) -> None:
        """Raise the `TransportError` that stopped delivery, if one did (cheap: called every period)."""
        ...

    @property
    def delivery_errors(self) -> DeliveryErrors:
        """Samples not delivered (undecodable, or their callback raised), per topic."""
        ...


class BaseTransport(Closing):
    """What both transports share: `with` calls their `close()`, `closed`, and `raise_if_failed` raises the
    `TransportError` their receive thread left in `_error` when it stopped (delivery stopped there)."""

    _closed: bool
    _error: BaseException | None

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("transport is closed")

    def raise_if_failed(self) -> None:
        """Raise the `TransportError` the receive thread left when it failed (delivery stopped there)."""
        if self._error is not None:
            raise self._error


def ros_topic(topic: str) -> str:
    """The absolute ROS 2 name of `topic`; raises `TransportError` naming a malformed one."""
    if not isinstance(topic, str) or not _TOPIC.fullmatch(topic):
        raise TransportError(f"topic {topic!r} is not a valid ROS 2 topic name")
    return topic if topic.startswith("/") else f"/{topic}"


def check_depth(depth: int) -> int:
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise TransportError(f"QoS depth {depth!r} must be a positive integer")
    return depth


def wait_for_subscribers(publisher: Publisher, *, count: int = 1, timeout: float = 5.0) -> bool:
    """Poll until `publisher` has `count` matched subscriptions; False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while publisher.subscriber_count() < count:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True
