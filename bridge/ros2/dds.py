"""The ROS 2 wire without ROS 2: Cyclone DDS topics `rt/<name>`, ROS 2 type names, raw CDR.

A ROS 2 node on the same domain sees `DdsTransport`'s endpoints as its own kind: topic
`rt/joint_states`, type `sensor_msgs::msg::dds_::JointState_`, XCDR1 little-endian payloads.
The payload bytes are rosbags' CDR, written and taken as they are:

- the DDS topic type is a cyclonedds `IdlStruct` generated from the rosbags typestore
  (`idl_type`), so Cyclone announces the ROS 2 type name and a matching XTypes type object,
  and there is still one source of message definitions;
- samples never go through that struct: `ddspy_write(writer, cdr)` and `ddspy_take(reader, ...)`
  (the C entry points under cyclonedds' own `DataWriter.write` / `DataReader.take`) move the
  serialized bytes, so an Image is copied, never walked element by element in Python.

`to_idl(msg)` builds the equivalent IdlStruct sample; the tests check that cyclonedds serializes
it to exactly rosbags' bytes for every supported type.

Never let Cyclone pick interfaces on a shared machine: without a `CYCLONEDDS_URI` it multicasts
on eth0. Tests set `loopback_config(domain_id)` before any participant exists:

    >>> xml = loopback_config(7)
    >>> '<Domain id="7">' in xml and '<AllowMulticast>false</AllowMulticast>' in xml
    True
    >>> dds_topic("/joint_states"), idl_type("std_msgs/msg/Bool").__idl_typename__
    ('rt/joint_states', 'std_msgs::msg::dds_::Bool_')
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from xml.sax.saxutils import escape

import numpy as np
from cyclonedds._clayer import ddspy_take, ddspy_write
from cyclonedds.core import GuardCondition, InstanceState, ReadCondition, SampleState, ViewState, WaitSet
from cyclonedds.domain import DomainParticipant
from cyclonedds.idl import IdlStruct, make_idl_struct
from cyclonedds.idl import types as t
from cyclonedds.pub import DataWriter
from cyclonedds.qos import Policy, Qos
from cyclonedds.sub import DataReader
from cyclonedds.topic import Topic
from cyclonedds.util import duration
from rosbags.interfaces import Nodetype

from bridge.ros2 import messages
from bridge.ros2.transport import BaseTransport, DeliveryErrors, TransportError, check_depth, ros_topic

log = logging.getLogger("tether.dds")

_ANY_STATE = SampleState.Any | ViewState.Any | InstanceState.Any
_TAKE_BATCH = 64
_BASE = {"bool": bool, "byte": t.byte, "char": t.uint8, "int8": t.int8, "uint8": t.uint8,
         "int16": t.int16, "uint16": t.uint16, "int32": t.int32, "uint32": t.uint32, "int64": t.int64,
         "uint64": t.uint64, "float32": t.float32, "float64": t.float64, "string": str}


def loopback_config(domain_id: int, *, max_participants: int = 32, trace_file: str | None = None) -> str:
    """A `CYCLONEDDS_URI` XML that keeps `domain_id` on 127.0.0.1: no multicast, unicast discovery.

    Up to `max_participants` processes per domain find each other through the loopback peer
    (participant indices are assigned automatically). `trace_file` turns on Cyclone's
    config-level trace, which records the interfaces it selected.
    """
    if not isinstance(domain_id, int) or not 0 <= domain_id <= 232:
        raise TransportError(f"domain_id {domain_id!r} must be an integer in [0, 232]")
    if not 1 <= max_participants <= 120:
        raise TransportError(f"max_participants {max_participants!r} must be in [1, 120]")
    tracing = "" if trace_file is None else (
        f"<Tracing><Verbosity>config</Verbosity><OutputFile>{escape(trace_file)}</OutputFile></Tracing>")
    return (
        '<CycloneDDS xmlns="https://cdds.io/config">'
        f'<Domain id="{domain_id}">'
        '<General><Interfaces><NetworkInterface address="127.0.0.1"/></Interfaces>'
        "<AllowMulticast>false</AllowMulticast></General>"
        '<Discovery><Peers><Peer address="127.0.0.1"/></Peers>'
        "<ParticipantIndex>auto</ParticipantIndex>"
        f"<MaxAutoParticipantIndex>{max_participants}</MaxAutoParticipantIndex></Discovery>"
        f"{tracing}</Domain></CycloneDDS>"
    )


def dds_topic(topic: str) -> str:
    """The DDS topic name ROS 2 uses for a ROS 2 topic: `/a/b` -> `rt/a/b`."""
    return "rt" + ros_topic(topic)


def _idl_field(desc: tuple) -> object:
    node, detail = desc
    if node == Nodetype.BASE:
        base, bound = detail
        if base not in _BASE:
            raise TransportError(f"no DDS mapping for ROS 2 base type {base!r}")
        return t.bounded_str[bound] if base == "string" and bound else _BASE[base]
    if node == Nodetype.NAME:
        return idl_type(detail)
    sub, size = detail
    if node == Nodetype.ARRAY:
        return t.array[_idl_field(sub), size]
    return t.sequence[_idl_field(sub), size] if size else t.sequence[_idl_field(sub)]


@functools.cache
def idl_type(name: str) -> type[IdlStruct]:
    """The cyclonedds struct for a ROS 2 type, generated from the rosbags typestore definition."""
    name = messages.ros_type(name)
    _, fields = messages.TYPESTORE.fielddefs[name]
    return make_idl_struct(name.rsplit("/", 1)[1] + "_", messages.dds_type_name(name),
                           {field: _idl_field(desc) for field, desc in fields})


def to_idl(msg: object) -> IdlStruct:
    """The `idl_type` sample equal to a rosbags message (for checking, not on the hot path)."""
    name = messages.ros_type(msg.__msgtype__)
    _, fields = messages.TYPESTORE.fielddefs[name]
    return idl_type(name)(**{field: _idl_value(getattr(msg, field), desc) for field, desc in fields})


def _idl_value(value: object, desc: tuple) -> object:
    node, detail = desc
    if node == Nodetype.NAME:
        return to_idl(value)
    if node == Nodetype.BASE:
        return value
    sub = detail[0]
    if sub[0] == Nodetype.NAME:
        return [to_idl(v) for v in value]
    if node == Nodetype.ARRAY and sub[1][0] in ("uint8", "byte"):
        return np.asarray(value, np.uint8).tobytes()
    return value.tolist() if isinstance(value, np.ndarray) else list(value)


def qos(*, reliable: bool, depth: int = 10, durable: bool = False) -> Qos:
    """ROS 2 QoS: keep-last `depth`; reliable (commands) or best effort (sensors); volatile, or
    transient-local with `durable` (a late subscriber gets what a live writer last wrote).

    The data representation is pinned to XCDR1, the `CDR_LE` that rosbags writes and ROS 2 reads.
    """
    reliability = Policy.Reliability.Reliable(duration(milliseconds=100)) if reliable \
        else Policy.Reliability.BestEffort
    durability = Policy.Durability.TransientLocal if durable else Policy.Durability.Volatile
    return Qos(reliability, Policy.History.KeepLast(check_depth(depth)), durability,
               Policy.DataRepresentation(use_cdrv0_representation=True))


def _pad4(data: memoryview) -> memoryview | bytes:
    """Cyclone wants payloads in whole 4-byte units (cyclonedds' own writer pads the same way)."""
    pad = -len(data) % 4
    return data if pad == 0 else bytes(data) + bytes(pad)


def _check_uri(domain_id: int) -> None:
    uri = os.environ.get("CYCLONEDDS_URI", "")
    ids = re.findall(r"<Domain\s+id\s*=\s*[\"']([^\"']*)[\"']", uri, flags=re.IGNORECASE)
    if ids and str(domain_id) not in ids and "any" not in ids:
        raise TransportError(f"CYCLONEDDS_URI configures domain(s) {ids}, not {domain_id}: Cyclone "
                             "would use its defaults (multicast on every interface) for this domain")


class DdsPublisher:
    """Writes rosbags messages of one type as CDR on one `rt/` topic."""

    def __init__(self, transport: DdsTransport, writer: DataWriter, topic: str, msg_type: str):
        self._transport, self._writer, self.topic, self.msg_type = transport, writer, topic, msg_type

    def __call__(self, msg: object) -> None:
        """Write `msg`; any failure is a `TransportError`. It works after the receive loop failed,
        so the edge node's fail-safe can still put the safe action on the wire."""
        if self._transport.closed:
            raise TransportError(f"cannot publish on {self.topic}: the transport is closed")
        if getattr(msg, "__msgtype__", None) != self.msg_type:
            raise TransportError(f"{self.topic} publishes {self.msg_type}, got {type(msg).__name__}")
        try:
            ret = ddspy_write(self._writer._ref, _pad4(messages.serialize(msg)))
        except Exception as exc:
            raise TransportError(f"write on {self.topic} failed: {exc!r}") from exc
        if ret < 0:
            raise TransportError(f"write on {self.topic} failed with DDS return code {ret}")

    def subscriber_count(self) -> int:
        return self._writer.get_publication_matched_status().current_count


@dataclass(frozen=True)
class _Subscription:
    topic: str
    msg_type: str
    reader: DataReader
    condition: ReadCondition
    callback: Callable[[object], None]


class DdsTransport(BaseTransport):
    """`Transport` over Cyclone DDS: one participant, one receive thread for all callbacks.

    Set `CYCLONEDDS_URI` (see `loopback_config`) before the first participant of a domain.
    """

    def __init__(self, *, domain_id: int = 0, node_name: str = "tether_edge"):
        _check_uri(domain_id)
        self.domain_id, self.node_name = domain_id, node_name
        self._participant = DomainParticipant(domain_id, qos=Qos(
            Policy.EntityName(node_name), Policy.Userdata(b"enclave=/;")))
        self._topics: dict[str, tuple[Topic, str]] = {}
        self._subs: list[_Subscription] = []
        self._lock = threading.Lock()
        self._waitset = WaitSet(self._participant)
        self._wake = GuardCondition(self._participant)
        self._waitset.attach(self._wake)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closed = False
        self.delivery_errors = DeliveryErrors(log)

    def _topic(self, topic: str, msg_type: str) -> tuple[Topic, str]:
        self._check_open()
        name, msg_type = dds_topic(topic), messages.ros_type(msg_type)
        known = self._topics.get(name)
        if known is None:
            known = self._topics[name] = (Topic(self._participant, name, idl_type(msg_type)), msg_type)
        elif known[1] != msg_type:
            raise TransportError(f"topic {topic} already carries {known[1]}, not {msg_type}")
        return known

    def subscribe(self, topic: str, msg_type: str, callback: Callable[[object], None], *,
                  reliable: bool = False, depth: int = 10, durable: bool = False) -> None:
        dds, msg_type = self._topic(topic, msg_type)
        reader = DataReader(self._participant, dds, qos=qos(reliable=reliable, depth=depth, durable=durable))
        condition = ReadCondition(reader, _ANY_STATE)
        with self._lock:
            self._subs.append(_Subscription(ros_topic(topic), msg_type, reader, condition, callback))
            self._waitset.attach(condition)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"dds-{self.node_name}", daemon=True)
            self._thread.start()

    def publisher(self, topic: str, msg_type: str, *, reliable: bool = True, depth: int = 10,
                  durable: bool = False) -> DdsPublisher:
        dds, msg_type = self._topic(topic, msg_type)
        writer = DataWriter(self._participant, dds, qos=qos(reliable=reliable, depth=depth, durable=durable))
        return DdsPublisher(self, writer, ros_topic(topic), msg_type)

    def _run(self) -> None:
        """The receive thread. Anything that ends it other than `close()` (a failed take, any
        exception outside a callback or a sample's decoding) is kept as a `TransportError` for
        `raise_if_failed`: the edge node checks it every control period and fails safe."""
        wait = duration(milliseconds=200)
        try:
            while not self._stop.is_set():
                self._waitset.wait(wait)
                with self._lock:
                    subs = list(self._subs)
                for sub in subs:
                    if not self._deliver(sub):
                        return
        except BaseException as exc:  # noqa: BLE001 - whatever it was, delivery has stopped: say so
            error = TransportError(f"DDS receive loop of {self.node_name} stopped: {exc!r}")
            error.__cause__ = exc
            self._error = error
            log.error("%s", error)

    def _deliver(self, sub: _Subscription) -> bool:
        while not self._stop.is_set():
            samples = ddspy_take(sub.reader._ref, _ANY_STATE, _TAKE_BATCH)
            if isinstance(samples, int):
                self._error = TransportError(f"take on {sub.topic} failed with DDS return code {samples}")
                log.error("%s", self._error)
                return False
            for data, info in samples:
                if not info.valid_data:
                    continue
                self.delivery_errors.deliver(sub.topic, sub.msg_type, data, sub.callback)
            if len(samples) < _TAKE_BATCH:
                return True
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set(True)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self._participant.__del__()  # dds_delete: the participant and everything it created
        self._subs, self._topics = [], {}
        self.raise_if_failed()

