"""The topic map: which ROS 2 topics become which observation/action tensors (YAML, validated).

    >>> tmap = load_topic_map(DEFAULT_TOPIC_MAP)
    >>> [(s.name, s.dtype.name, s.shape) for s in tmap.observation_specs()]
    [('joint_position', 'float32', (6,)), ('joint_velocity', 'float32', (6,))]
    >>> act = tmap.action_specs()[0]
    >>> act.name, act.shape, act.low[2], act.high[2]
    ('action', (6,), -3.1416, 3.1416)

Each control step assembles the latest message per topic into an observation, and turns the
policy's action (after the safety guard) into command messages:

    >>> joints = tmap.observation[0].joints
    >>> js = messages.joint_state(names=joints[::-1], position=np.arange(6.0), velocity=np.zeros(6))
    >>> obs = tmap.observation_arrays({"/joint_states": js})
    >>> obs["joint_position"].tolist()
    [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    >>> [(entry.topic, msg.data.tolist()) for entry, msg in tmap.commands({"action": np.ones(6)})]
    [('/policy_controller/commands', [1.0, 1.0, 1.0, 1.0, 1.0, 1.0])]

Cameras (bridge.ros2.cameras) travel encoded: a `sensor_msgs/msg/CompressedImage` entry's tensor declares its
decoded `shape` and `format` (jpeg, png), a raw `sensor_msgs/msg/Image` one may `encode` it (format, quality,
resize); their observation values are then encoded `Tensor`s, not arrays:

    >>> cams = parse_topic_map({"observation": [
    ...     {"topic": "/wrist/compressed", "type": "sensor_msgs/msg/CompressedImage",
    ...      "tensors": {"wrist": {"field": "image", "shape": [240, 320, 3], "format": "jpeg"}}},
    ...     {"topic": "/front/image_raw", "type": "sensor_msgs/msg/Image",
    ...      "tensors": {"front": {"field": "image", "shape": [224, 224, 3],
    ...                            "encode": {"format": "jpeg", "quality": 90, "resize": [224, 224]}}}}],
    ...     "action": yaml.safe_load(DEFAULT_TOPIC_MAP.read_text())["action"]})
    >>> [(s.name, s.shape, s.encoding) for s in cams.observation_specs()]
    [('wrist', (240, 320, 3), 1), ('front', (224, 224, 3), 1)]

Mistakes are reported with the key that holds them:

    >>> try:
    ...     parse_topic_map({"observation": [{"topic": "/j", "type": "sensor_msgs/msg/JointState",
    ...                                       "joints": ["a"], "tensors": {"q": {"field": "pos"}}}],
    ...                      "action": []})
    ... except TopicMapError as exc:
    ...     print(exc)
    topic map: observation[0].tensors.q.field: 'pos' is not one of ['position', 'velocity', 'effort']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from bridge.ros2 import messages
from bridge.ros2.cameras import Camera, CameraConfigError
from bridge.ros2.transport import TransportError, ros_topic
from protos.codec import IMAGE_FORMATS, Spec, TensorError
from protos.tether.v1 import tensor_pb2

DEFAULT_TOPIC_MAP = Path(__file__).resolve().parents[2] / "launch" / "config" / "topic_map.yaml"
GAZEBO_TOPIC_MAP = DEFAULT_TOPIC_MAP.with_name("gazebo_arm.yaml")
JOINT_PLACEHOLDER = "{joint}"   # in a per-joint command topic: replaced by each joint's name


class TopicMapError(ValueError):
    """A topic map that does not validate; the message names the file, the key and the value."""


class MissingMessageError(LookupError):
    """No message has arrived yet on a topic the observation needs."""


@dataclass(frozen=True)
class TensorMap:
    """One tensor: which array `field` of the topic's message it is, and its `Spec`; for action
    tensors, optionally the guard's per-element velocity limit (units/s); for a camera, how it is encoded."""

    field: str
    spec: Spec
    velocity_limit: tuple[float, ...] = ()
    camera: Camera | None = None


@dataclass(frozen=True)
class TopicEntry:
    """One topic with its message type, QoS, joint order and the tensors it carries.

    A per-joint command entry (type `std_msgs/msg/Float64`, a topic with `{joint}` in it, as
    Gazebo's JointPositionController takes through ros_gz_bridge) lists in `per_joint` one
    concrete entry per joint, in joint order; its action tensor has one element per joint."""

    topic: str
    type: str
    reliable: bool
    joints: tuple[str, ...] = ()
    tensors: tuple[TensorMap, ...] = ()
    per_joint: tuple[TopicEntry, ...] = ()


@dataclass(frozen=True)
class InterventionEntry:
    """The teleop topic a person's command comes in on (a joystick, a leader arm): the action entry's
    message type, joints and tensors; the override holds while messages arrive within `hold_s`
    (None: the node's default, two control periods)."""

    entry: TopicEntry
    hold_s: float | None = None


@dataclass(frozen=True)
class TopicMap:
    observation: tuple[TopicEntry, ...]
    action: tuple[TopicEntry, ...]
    estop: TopicEntry | None = None
    intervention: InterventionEntry | None = None

    def observation_specs(self) -> tuple[Spec, ...]:
        return tuple(t.spec for e in self.observation for t in e.tensors)

    def action_specs(self) -> tuple[Spec, ...]:
        return tuple(t.spec for e in self.action for t in e.tensors)

    def command_entries(self) -> tuple[TopicEntry, ...]:
        """The topics commands go out on: every action entry, per-joint entries expanded."""
        return tuple(c for e in self.action for c in (e.per_joint or (e,)))

    def velocity_limits(self, default: float) -> tuple[float, ...]:
        """The guard's velocity limit per command element, spec order; `default` where the topic
        map sets none."""
        out: list[float] = []
        for e in self.action:
            for t in e.tensors:
                n = math.prod(t.spec.shape)
                out += list(t.velocity_limit) * (n if len(t.velocity_limit) == 1 else 1) or [default] * n
        return tuple(out)

    def measured_command(self, latest: Mapping[str, object]) -> np.ndarray | None:
        """The command vector that holds the robot where it is: every action tensor of an entry with
        joints, read from the latest JointState positions of those joints (spec order). None if an
        action tensor has no joints or no JointState received so far names them all."""
        positions: dict[str, float] = {}
        for entry in self.observation:
            msg = latest.get(entry.topic)
            if entry.type != messages.JOINT_STATE or msg is None:
                continue
            if len(msg.position) != len(msg.name):
                continue
            positions.update(zip(msg.name, (float(x) for x in msg.position), strict=True))
        out: list[float] = []
        for entry in self.action:
            if not entry.joints or any(j not in positions for j in entry.joints):
                return None
            for t in entry.tensors:
                if t.spec.shape != (len(entry.joints),):
                    return None
                out += [positions[j] for j in entry.joints]
        return np.array(out, np.float64)

    def observation_arrays(self, latest: Mapping[str, object]) -> dict[str, np.ndarray | tensor_pb2.Tensor]:
        """The observation from the latest message per topic (`{topic: msg}`), in spec dtypes; a camera's
        value is its encoded `Tensor` (bridge.ros2.cameras)."""
        out = {}
        for entry in self.observation:
            msg = latest.get(entry.topic)
            if msg is None:
                raise MissingMessageError(f"no {entry.type} received on {entry.topic} yet")
            try:
                arrays = messages.to_arrays(msg, joints=entry.joints)
            except messages.MessageError as exc:
                raise messages.MessageError(f"{entry.topic}: {exc}") from None
            for tm in entry.tensors:
                if tm.camera is not None:
                    try:
                        out[tm.spec.name] = tm.camera.tensor(tm.spec, msg)
                    except messages.MessageError as exc:
                        raise messages.MessageError(f"{entry.topic}: {exc}") from None
                    continue
                if tm.field not in arrays:
                    raise messages.MessageError(f"{entry.topic}: {entry.type}.{tm.field} is empty, "
                                                f"but tensor {tm.spec.name!r} needs it")
                arr = arrays[tm.field]
                if arr.shape != tm.spec.shape:
                    raise messages.MessageError(f"{entry.topic}: {tm.field} has shape {list(arr.shape)}, "
                                                f"tensor {tm.spec.name!r} expects {list(tm.spec.shape)}")
                out[tm.spec.name] = arr.astype(tm.spec.dtype, copy=False)
        return out

    def commands(self, action: Mapping[str, np.ndarray]) -> list[tuple[TopicEntry, object]]:
        """One message per action topic from the action tensors (already through the guard)."""
        unknown = set(action) - {s.name for s in self.action_specs()}
        if unknown:
            raise messages.MessageError(f"action tensor {sorted(unknown)[0]!r} is not in the topic map")
        out = []
        for entry in self.action:
            arrays = {}
            for tm in entry.tensors:
                if tm.spec.name not in action:
                    raise messages.MessageError(f"action tensor {tm.spec.name!r} missing")
                arr = np.asarray(action[tm.spec.name])
                if arr.shape != tm.spec.shape:
                    raise messages.MessageError(f"action tensor {tm.spec.name!r} has shape "
                                                f"{list(arr.shape)}, expected {list(tm.spec.shape)}")
                arrays[tm.field] = arr
            if entry.per_joint:
                values = np.asarray(arrays["data"], dtype=np.float64).reshape(-1)
                out += [(one, messages.float64_msg(v)) for one, v in zip(entry.per_joint, values, strict=True)]
            else:
                out.append((entry, messages.from_arrays(entry.type, arrays, joints=entry.joints)))
        return out

    def intervention_vector(self, msg: object) -> np.ndarray:
        """A person's command from the intervention topic as the guard's command vector (action tensors
        concatenated in spec order, float64). MessageError if the message does not fit the layout.

            >>> tm = parse_topic_map({**yaml.safe_load(DEFAULT_TOPIC_MAP.read_text()),
            ...                       "intervention": {"topic": "/teleop/commands", "hold_s": 0.05}})
            >>> tm.intervention.entry.topic, tm.intervention.entry.type, tm.intervention.hold_s
            ('/teleop/commands', 'std_msgs/msg/Float64MultiArray', 0.05)
            >>> tm.intervention_vector(messages.float64_array(np.arange(6.0))).tolist()
            [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        """
        entry = self.intervention.entry
        arrays = messages.to_arrays(msg, joints=entry.joints)
        parts = []
        for tm in entry.tensors:
            arr = arrays.get(tm.field)
            if arr is None or arr.shape != tm.spec.shape:
                got = "nothing" if arr is None else f"shape {list(arr.shape)}"
                raise messages.MessageError(f"{entry.topic}: {entry.type}.{tm.field} has {got}, tensor "
                                            f"{tm.spec.name!r} expects {list(tm.spec.shape)}")
            parts.append(np.asarray(arr, np.float64).reshape(-1))
        return np.concatenate(parts)

    def estop_active(self, msg: object) -> bool:
        """Whether an e-stop topic message asks to stop."""
        return bool(msg.data)


# -- parsing -------------------------------------------------------------------------------------

class _Ctx:
    def __init__(self, source: str):
        self.source = source

    def error(self, key: str, problem: str) -> TopicMapError:
        return TopicMapError(f"{self.source}: {key}: {problem}")

    def mapping(self, value: object, key: str, allowed: set[str], required: set[str] = frozenset()) -> dict:
        if not isinstance(value, Mapping):
            raise self.error(key, f"expected a mapping, got {value!r}")
        for k in value:
            if k not in allowed:
                raise self.error(f"{key}.{k}" if key else str(k), f"unknown key; allowed: {sorted(allowed)}")
        for k in sorted(required - set(value)):
            raise self.error(f"{key}.{k}" if key else k, "missing")
        return dict(value)

    def parsed(self, key: str, parse: Callable[[str], str], text: str) -> str:
        """`parse(text)` (a type or topic name); its MessageError or TransportError as a TopicMapError at `key`."""
        try:
            return parse(text)
        except (messages.MessageError, TransportError) as exc:
            raise self.error(key, str(exc)) from None


def load_topic_map(path: str | Path) -> TopicMap:
    """Read and validate a topic map YAML file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TopicMapError(f"{path}: cannot read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except Exception as exc:  # the YAML parser's own error types, reported with their position
        raise TopicMapError(f"{path}: not valid YAML: {exc}") from None
    return parse_topic_map(data, source=str(path))


def parse_topic_map(data: object, *, source: str = "topic map") -> TopicMap:
    """Validate an already-loaded topic map (a mapping with observation/action/estop/intervention)."""
    ctx = _Ctx(source)
    top = ctx.mapping(data, "", {"observation", "action", "estop", "intervention"}, {"observation", "action"})
    obs = _entries(ctx, top["observation"], "observation", action=False)
    act = _entries(ctx, top["action"], "action", action=True)
    estop = None
    if top.get("estop") is not None:
        estop = _entry(ctx, top["estop"], "estop", action=True, tensors=False)
        if estop.type != messages.BOOL:
            raise ctx.error("estop.type", f"{estop.type!r} must be {messages.BOOL}")
    intervention = None if top.get("intervention") is None else _intervention(ctx, top["intervention"], act)
    extra = [e for e in (estop, intervention and intervention.entry) if e]
    topics = [c.topic for e in (*obs, *act, *extra) for c in (e.per_joint or (e,))]
    for topic in topics:
        if topics.count(topic) > 1:
            raise ctx.error("topic", f"{topic} is listed more than once")
    for part, entries in (("observation", obs), ("action", act)):
        names = [t.spec.name for e in entries for t in e.tensors]
        for name in names:
            if names.count(name) > 1:
                raise ctx.error(part, f"tensor name {name!r} is used more than once")
    return TopicMap(obs, act, estop, intervention)


def _intervention(ctx: _Ctx, value: object, act: tuple[TopicEntry, ...]) -> InterventionEntry:
    """`intervention: {topic, reliable, hold_s}`: the person's command in the (one) action entry's type and layout."""
    d = ctx.mapping(value, "intervention", {"topic", "type", "reliable", "hold_s"}, {"topic"})
    if len(act) != 1 or act[0].per_joint:
        raise ctx.error("intervention", "the person's command comes as one message in the action's layout, so the "
                                        "topic map needs exactly one action topic without {joint}, got "
                                        f"{[e.topic for e in act]}")
    action = act[0]
    typed = ctx.parsed("intervention.type", messages.ros_type, str(d.get("type", action.type)))
    if typed != action.type:
        raise ctx.error("intervention.type", f"{d['type']!r}: the intervention topic carries the action's type "
                                             f"{action.type}")
    topic = ctx.parsed("intervention.topic", ros_topic, str(d["topic"]))
    rel = d.get("reliable", True)
    if not isinstance(rel, bool):
        raise ctx.error("intervention.reliable", f"{rel!r} is not true or false")
    hold = d.get("hold_s")
    if hold is not None and (isinstance(hold, bool) or not isinstance(hold, int | float) or not math.isfinite(hold)
                             or hold <= 0):
        raise ctx.error("intervention.hold_s", f"expected seconds > 0 (the override ends this long after the last "
                                               f"message), got {hold!r}")
    entry = TopicEntry(topic, action.type, rel, action.joints, action.tensors)
    return InterventionEntry(entry, None if hold is None else float(hold))


def _entries(ctx: _Ctx, value: object, key: str, *, action: bool) -> tuple[TopicEntry, ...]:
    if not isinstance(value, list) or not value:
        raise ctx.error(key, f"expected a non-empty list of topics, got {value!r}")
    return tuple(_entry(ctx, v, f"{key}[{i}]", action=action, tensors=True)
                 for i, v in enumerate(value))


def _entry(ctx: _Ctx, value: object, key: str, *, action: bool, tensors: bool) -> TopicEntry:
    """Observation topics default to best effort (sensor QoS), command topics to reliable."""
    allowed = {"topic", "type", "reliable", "joints"} | ({"tensors"} if tensors else set())
    d = ctx.mapping(value, key, allowed, {"topic", "type"} | ({"tensors"} if tensors else set()))
    msg_type = ctx.parsed(f"{key}.type", messages.supported_type, str(d["type"]))
    template = str(d["topic"])
    per_joint_topic = JOINT_PLACEHOLDER in template
    topic = template if per_joint_topic else ctx.parsed(f"{key}.topic", ros_topic, template)
    rel = d.get("reliable", action)
    if not isinstance(rel, bool):
        raise ctx.error(f"{key}.reliable", f"{rel!r} is not true or false")
    joints = d.get("joints", [])
    if not isinstance(joints, list) or not all(isinstance(j, str) and j for j in joints):
        raise ctx.error(f"{key}.joints", f"expected a list of joint names, got {joints!r}")
    if len(set(joints)) != len(joints):
        raise ctx.error(f"{key}.joints", f"duplicate joint names in {joints}")
    if msg_type == messages.JOINT_STATE and not joints:
        raise ctx.error(f"{key}.joints", f"{msg_type} needs the joint names, in tensor order")
    per_joint = _per_joint(ctx, topic, msg_type, rel, joints, key, action=action) if per_joint_topic else ()
    if action and msg_type == messages.FLOAT64 and joints and not per_joint_topic:
        raise ctx.error(f"{key}.topic", f"{topic!r}: {msg_type} commands for joints need a per-joint topic "
                                         f"with {JOINT_PLACEHOLDER} in it, e.g. /model/arm/joint/{{joint}}/cmd_pos")
    entry = TopicEntry(topic, msg_type, rel, tuple(joints), per_joint=per_joint)
    if not tensors:
        return entry
    tmap = d["tensors"]
    if not isinstance(tmap, Mapping) or not tmap:
        raise ctx.error(f"{key}.tensors", f"expected a mapping of tensor names, got {tmap!r}")
    parsed = tuple(_tensor(ctx, entry, str(name), spec, f"{key}.tensors.{name}", action=action)
                   for name, spec in tmap.items())
    fields = [t.field for t in parsed]
    for f in fields:
        if action and fields.count(f) > 1:
            raise ctx.error(f"{key}.tensors", f"field {f!r} is set by more than one tensor")
    return TopicEntry(topic, msg_type, rel, tuple(joints), parsed, per_joint)


def _per_joint(ctx: _Ctx, template: str, msg_type: str, reliable: bool, joints: list[str], key: str, *,
               action: bool) -> tuple[TopicEntry, ...]:
    """One `std_msgs/Float64` command entry per joint from a topic template with `{joint}`."""
    if not action:
        raise ctx.error(f"{key}.topic", f"{template!r}: per-joint topics ({JOINT_PLACEHOLDER}) are for actions only")
    if msg_type != messages.FLOAT64:
        raise ctx.error(f"{key}.type", f"{msg_type!r}: a per-joint topic ({template!r}) carries {messages.FLOAT64}")
    if not joints:
        raise ctx.error(f"{key}.joints", f"the per-joint topic {template!r} needs the joint names")
    out = []
    for joint in joints:
        try:
            topic = ros_topic(template.replace(JOINT_PLACEHOLDER, joint))
        except TransportError as exc:
            raise ctx.error(f"{key}.topic", f"joint {joint!r}: {exc}") from None
        out.append(TopicEntry(topic, msg_type, reliable, (joint,)))
    return tuple(out)


def _tensor(ctx: _Ctx, entry: TopicEntry, name: str, value: object, key: str, *, action: bool) -> TensorMap:
    cameras = {messages.IMAGE: {"encode"}, messages.COMPRESSED_IMAGE: {"format"}}.get(entry.type, set())
    d = ctx.mapping(value, key, {"field", "dtype", "shape"} | ({"bounds", "velocity_limit"} if action else cameras),
                    {"field"} | ({"shape"} if entry.type == messages.COMPRESSED_IMAGE else set()))
    if action and entry.type == messages.COMPRESSED_IMAGE:
        raise ctx.error(f"{key}", f"{entry.type} is an observation type (the edge does not publish it)")
    field = d["field"]
    if field not in messages.FIELDS[entry.type]:
        raise ctx.error(f"{key}.field", f"{field!r} is not one of {list(messages.FIELDS[entry.type])}")
    native = messages.field_dtype(entry.type, field)
    default = native if native.kind != "f" else np.dtype(np.float32)
    try:
        dtype = np.dtype(d.get("dtype", default))
        Spec(name, dtype, ())
    except (TypeError, TensorError) as exc:
        raise ctx.error(f"{key}.dtype", f"{d.get('dtype')!r} is not a tensor dtype ({exc})") from None
    shape = messages.field_shape(entry.type, field, joints=entry.joints)
    if entry.joints and (entry.type == messages.FLOAT64_ARRAY and shape is None or entry.per_joint):
        shape = (len(entry.joints),)
    if "shape" in d:
        declared = d["shape"]
        if not isinstance(declared, list) or not all(isinstance(n, int) and n >= 0 for n in declared):
            raise ctx.error(f"{key}.shape", f"expected a list of non-negative integers, got {declared!r}")
        if shape is not None and tuple(declared) != shape:
            raise ctx.error(f"{key}.shape", f"{declared} disagrees with {entry.type}.{field}: {list(shape)}")
        if entry.type in (messages.IMAGE, messages.COMPRESSED_IMAGE) and (len(declared) != 3 or
                                                                           declared[2] not in (1, 3)):
            raise ctx.error(f"{key}.shape", f"{declared} is not [height, width, 1 or 3]")
        shape = tuple(declared)
    if shape is None:
        raise ctx.error(f"{key}.shape", f"missing: {entry.type}.{field} has no fixed shape")
    low, high = _bounds(ctx, d.get("bounds"), entry, shape, f"{key}.bounds")
    limit = _velocity_limit(ctx, d.get("velocity_limit"), entry, shape, f"{key}.velocity_limit")
    camera = _camera(ctx, d, entry, dtype, shape, key)
    spec = Spec(name, dtype, shape, low, high, encoding=camera.encoding if camera else tensor_pb2.RAW)
    return TensorMap(field, spec, limit, camera)


def _camera(ctx: _Ctx, d: dict, entry: TopicEntry, dtype: np.dtype, shape: tuple[int, ...],
            key: str) -> Camera | None:
    """A CompressedImage's `format` (its bytes go as they came), or a raw Image's `encode` settings; None: the
    tensor travels as it is (RAW)."""
    if entry.type == messages.COMPRESSED_IMAGE:
        fmt = d.get("format", "jpeg")
        if fmt not in IMAGE_FORMATS:
            raise ctx.error(f"{key}.format", f"{fmt!r} is not one of {sorted(IMAGE_FORMATS)}")
        camera = Camera(fmt)
    elif "encode" in d:
        try:
            camera = Camera.parse(d["encode"], shape=shape, key=f"{key}.encode")
        except CameraConfigError as exc:
            raise ctx.error(*str(exc).split(": ", 1)) from None
    else:
        return None
    if dtype != np.uint8:
        raise ctx.error(f"{key}.dtype", f"{dtype.name}: an encoded camera tensor is uint8")
    return camera


def _velocity_limit(ctx: _Ctx, value: object, entry: TopicEntry, shape: tuple[int, ...],
                    key: str) -> tuple[float, ...]:
    """One limit for every element, or `{joint: limit}` for each joint; units per second, > 0."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        if not entry.joints or shape != (len(entry.joints),):
            raise ctx.error(key, f"per-joint limits need the entry's joints and shape [n], not {list(shape)}")
        for joint in value:
            if joint not in entry.joints:
                raise ctx.error(f"{key}.{joint}", f"not one of the joints {list(entry.joints)}")
        missing = [j for j in entry.joints if j not in value]
        if missing:
            raise ctx.error(f"{key}.{missing[0]}", "missing")
        values = [value[j] for j in entry.joints]
    else:
        values = [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v) or v <= 0:
            raise ctx.error(key, f"expected a velocity limit > 0 (units/s), got {v!r}")
    return tuple(float(v) for v in values)


def _bounds(ctx: _Ctx, value: object, entry: TopicEntry, shape: tuple[int, ...],
            key: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if value is None:
        return (), ()
    if isinstance(value, Mapping):
        if not entry.joints:
            raise ctx.error(key, "per-joint bounds need the entry's joints")
        for joint in value:
            if joint not in entry.joints:
                raise ctx.error(f"{key}.{joint}", f"not one of the joints {list(entry.joints)}")
        for joint in entry.joints:
            if joint not in value:
                raise ctx.error(f"{key}.{joint}", "missing")
        if shape != (len(entry.joints),):
            raise ctx.error(key, f"per-joint bounds need shape [{len(entry.joints)}], not {list(shape)}")
        pairs = [(_pair(ctx, value[j], f"{key}.{j}")) for j in entry.joints]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    low, high = _pair(ctx, value, key)
    return (low,), (high,)


def _pair(ctx: _Ctx, value: object, key: str) -> tuple[float, float]:
    ok = isinstance(value, list) and len(value) == 2 and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    if not ok:
        raise ctx.error(key, f"expected [low, high], got {value!r}")
    low, high = float(value[0]), float(value[1])
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ctx.error(key, f"{value} must be finite")
    if not low < high:
        raise ctx.error(key, f"low {low} is not below high {high}")
    return low, high
