"""`Transport` over rclpy, for robots with a sourced ROS 2 installation.

Same contract as `DdsTransport`: rosbags messages in and out, callbacks on one receive thread.
Messages cross rclpy as serialized CDR (subscriptions with `raw=True`, `Publisher.publish(bytes)`),
so rosbags stays the only place messages are converted; the generated rclpy message classes are
used only to name the topic type. rclpy is imported when a transport is created, never at import
time, so this module imports anywhere:

    transport = RclpyTransport(domain_id=0, node_name="tether_edge")
    transport.subscribe("/joint_states", "sensor_msgs/msg/JointState", on_joint_state)
    command = transport.publisher("/policy_controller/commands", "std_msgs/msg/Float64MultiArray")
    command(messages.float64_array(action))
    transport.close()
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable

from bridge.ros2 import messages
from bridge.ros2.transport import BaseTransport, DeliveryErrors, TransportError, check_depth, ros_topic

log = logging.getLogger("tether.rclpy")


def _message_class(msg_type: str) -> type:
    pkg, kind, name = messages.ros_type(msg_type).split("/")
    try:
        return getattr(importlib.import_module(f"{pkg}.{kind}"), name)
    except (ImportError, AttributeError):
        raise TransportError(f"ROS 2 message type {msg_type} is not installed ({pkg} package)") from None


def _qos(*, reliable: bool, depth: int, durable: bool = False) -> object:
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(depth=check_depth(depth), history=HistoryPolicy.KEEP_LAST,
                      reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL if durable else DurabilityPolicy.VOLATILE)


class RclpyPublisher:
    """Publishes rosbags messages of one type on one topic, as serialized CDR."""

    def __init__(self, transport: RclpyTransport, publisher: object, topic: str, msg_type: str):
        self._transport, self._publisher, self.topic, self.msg_type = transport, publisher, topic, msg_type

    def __call__(self, msg: object) -> None:
        """Publish `msg`; any failure (an rclpy error included) is a `TransportError`, which the edge
        node answers by failing safe. It works after the executor failed (publishing needs no spin)."""
        if self._transport.closed:
            raise TransportError(f"cannot publish on {self.topic}: the transport is closed")
        if getattr(msg, "__msgtype__", None) != self.msg_type:
            raise TransportError(f"{self.topic} publishes {self.msg_type}, got {type(msg).__name__}")
        try:
            self._publisher.publish(bytes(messages.serialize(msg)))
        except Exception as exc:
            raise TransportError(f"publish on {self.topic} failed: {exc!r}") from exc

    def subscriber_count(self) -> int:
        return self._publisher.get_subscription_count()


class RclpyTransport(BaseTransport):
    """One rclpy context and node, spun by one executor thread."""

    def __init__(self, *, domain_id: int = 0, node_name: str = "tether_edge"):
        try:
            import rclpy
            from rclpy.context import Context
            from rclpy.executors import SingleThreadedExecutor
            from rclpy.node import Node
        except ImportError as exc:
            raise TransportError(f"rclpy is not importable ({exc}); source a ROS 2 installation "
                                 "or use the 'dds' transport") from None
        self.domain_id, self.node_name = domain_id, node_name
        self._context = Context()
        init_kwargs = {"context": self._context, "domain_id": domain_id}
        try:  # Humble and later: the edge node handles signals itself
            from rclpy.signals import SignalHandlerOptions

            init_kwargs["signal_handler_options"] = SignalHandlerOptions.NO
        except ImportError:
            pass
        rclpy.init(**init_kwargs)
        self._node = Node(node_name, context=self._context)
        self._executor = SingleThreadedExecutor(context=self._context)
        self._executor.add_node(self._node)
        self._topics: dict[str, str] = {}
        self._error: BaseException | None = None
        self.delivery_errors = DeliveryErrors(log)
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._spin, name=f"rclpy-{node_name}", daemon=True)
        self._thread.start()

    def _check(self, topic: str, msg_type: str) -> tuple[str, str]:
        self._check_open()
        topic, msg_type = ros_topic(topic), messages.ros_type(msg_type)
        known = self._topics.setdefault(topic, msg_type)
        if known != msg_type:
            raise TransportError(f"topic {topic} already carries {known}, not {msg_type}")
        return topic, msg_type

    def subscribe(self, topic: str, msg_type: str, callback: Callable[[object], None], *,
                  reliable: bool = False, depth: int = 10, durable: bool = False) -> None:
        topic, msg_type = self._check(topic, msg_type)

        def on_raw(data: bytes) -> None:
            self.delivery_errors.deliver(topic, msg_type, data, callback)

        self._node.create_subscription(_message_class(msg_type), topic, on_raw,
                                       _qos(reliable=reliable, depth=depth, durable=durable), raw=True)

    def publisher(self, topic: str, msg_type: str, *, reliable: bool = True, depth: int = 10,
                  durable: bool = False) -> RclpyPublisher:
        topic, msg_type = self._check(topic, msg_type)
        qos = _qos(reliable=reliable, depth=depth, durable=durable)
        pub = self._node.create_publisher(_message_class(msg_type), topic, qos)
        return RclpyPublisher(self, pub, topic, msg_type)

    def _spin(self) -> None:
        try:
            while not self._stop.is_set() and self._context.ok():
                self._executor.spin_once(timeout_sec=0.1)
        except BaseException as exc:  # noqa: BLE001 - the executor broke: raise_if_failed() and close() raise it
            error = TransportError(f"rclpy executor of {self.node_name} stopped: {exc!r}")
            error.__cause__ = exc
            self._error = error
            log.error("%s", error)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._executor.shutdown()
        self._node.destroy_node()
        self._context.try_shutdown()
        self.raise_if_failed()
