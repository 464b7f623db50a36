"""ROS 2 messages: one source of definitions (the rosbags Humble typestore), CDR, numpy converters.

Every message in Tether is a rosbags message object. Its CDR bytes (little endian, 4-byte
encapsulation header) are exactly what a ROS 2 node puts on the DDS wire, so the DDS transport
sends these bytes as they are and rclpy accepts them as serialized messages.

    >>> msg = joint_state(names=["a", "b"], position=[0.1, 0.2], velocity=[1.0, 2.0], stamp=1.5)
    >>> raw = serialize(msg)
    >>> bytes(raw[:4]).hex(), dds_type_name(msg.__msgtype__)
    ('00010000', 'sensor_msgs::msg::dds_::JointState_')
    >>> back = deserialize(raw, JOINT_STATE)
    >>> arrays = to_arrays(back, joints=["b", "a"])          # in the declared joint order
    >>> arrays["position"].tolist(), arrays["velocity"].tolist(), sorted(arrays)
    ([0.2, 0.1], [2.0, 1.0], ['position', 'velocity'])
    >>> stamp_of(back)
    1.5

Converters go both ways through `to_arrays(msg)` / `from_arrays(type, arrays)`; each supported
type names its array fields in `FIELDS` (`field_shape` gives their shapes). Large payloads stay
numpy views over the byte buffer (an `Image` is never walked element by element in Python):

    >>> img = image(np.zeros((2, 3, 3), np.uint8))
    >>> view = to_arrays(deserialize(serialize(img), IMAGE))["image"]
    >>> view.shape, view.dtype.name, view.base is not None
    ((2, 3, 3), 'uint8', True)
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import numpy as np
from rosbags.typesys import Stores, get_typestore

TYPESTORE = get_typestore(Stores.ROS2_HUMBLE)

JOINT_STATE = "sensor_msgs/msg/JointState"
IMAGE = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE = "sensor_msgs/msg/CompressedImage"  # a camera driver's JPEG/PNG bytes (forwarded untouched)
IMU = "sensor_msgs/msg/Imu"
TWIST = "geometry_msgs/msg/Twist"
ODOMETRY = "nav_msgs/msg/Odometry"
FLOAT64_ARRAY = "std_msgs/msg/Float64MultiArray"
FLOAT64 = "std_msgs/msg/Float64"  # one joint's command, as ros_gz_bridge takes it for gz.msgs.Double
BOOL = "std_msgs/msg/Bool"
STRING = "std_msgs/msg/String"  # operator names (e-stop release); no tensor converter

# The array fields each supported type converts to and from (see `to_arrays`, `from_arrays`).
FIELDS: dict[str, tuple[str, ...]] = {
    JOINT_STATE: ("position", "velocity", "effort"),
    IMAGE: ("image",),
    COMPRESSED_IMAGE: ("image",),
    IMU: ("orientation", "angular_velocity", "linear_acceleration"),
    TWIST: ("twist",),
    ODOMETRY: ("pose", "twist"),
    FLOAT64_ARRAY: ("data",),
    FLOAT64: ("data",),
    BOOL: ("data",),
}
SUPPORTED: tuple[str, ...] = tuple(FIELDS)

_CHANNELS = {"rgb8": 3, "mono8": 1, "bgr8": 3}  # bgr8 is read as RGB (its channels reversed, a view)


class MessageError(ValueError):
    """A message type, field or value that Tether cannot convert; the message names it."""


def ros_type(name: str) -> str:
    """The canonical ROS 2 type name (`pkg/msg/Type`) of a typestore type; raises `MessageError`.

    >>> ros_type("sensor_msgs/JointState")
    'sensor_msgs/msg/JointState'
    """
    parts = name.split("/")
    if len(parts) == 2:
        name = f"{parts[0]}/msg/{parts[1]}"
    if name not in TYPESTORE.fielddefs:
        raise MessageError(f"unknown ROS 2 message type {name!r} (not in the Humble typestore)")
    return name


def supported_type(name: str) -> str:
    """`ros_type(name)`, further restricted to the types with numpy converters (`SUPPORTED`)."""
    name = ros_type(name)
    if name not in FIELDS:
        raise MessageError(f"message type {name!r} has no converter; supported: {list(SUPPORTED)}")
    return name


def dds_type_name(name: str) -> str:
    """The DDS type name a ROS 2 node registers: `pkg/msg/Type` -> `pkg::msg::dds_::Type_`.

    >>> dds_type_name("std_msgs/msg/Bool")
    'std_msgs::msg::dds_::Bool_'
    """
    pkg, kind, base = ros_type(name).split("/")
    return f"{pkg}::{kind}::dds_::{base}_"


def message_class(name: str) -> type:
    """The rosbags dataclass for a ROS 2 type name."""
    return TYPESTORE.types[ros_type(name)]


def serialize(msg: object) -> memoryview:
    """CDR bytes (little endian, with the encapsulation header) of a rosbags message."""
    return TYPESTORE.serialize_cdr(msg, msg.__msgtype__, little_endian=True)


def deserialize(data: bytes | memoryview, name: str) -> object:
    """A rosbags message from CDR bytes; numeric sequences are numpy views over `data`.

    The memoryview matters: rosbags slices off the header, which would copy a `bytes` payload.
    """
    return TYPESTORE.deserialize_cdr(memoryview(data), ros_type(name))


# -- headers -------------------------------------------------------------------------------------

def header(*, stamp: float | None = None, frame_id: str = "") -> object:
    """A `std_msgs/Header`; `stamp` in seconds (default: now)."""
    t = time.time() if stamp is None else float(stamp)
    sec = math.floor(t)
    nanosec = min(round((t - sec) * 1e9), 999_999_999)
    time_cls = TYPESTORE.types["builtin_interfaces/msg/Time"]
    return TYPESTORE.types["std_msgs/msg/Header"](stamp=time_cls(sec=sec, nanosec=nanosec), frame_id=frame_id)


def stamp_of(msg: object) -> float | None:
    """The header stamp of `msg` in seconds, or None for a type without a header."""
    hdr = getattr(msg, "header", None)
    return None if hdr is None else hdr.stamp.sec + hdr.stamp.nanosec * 1e-9


# -- per-type converters -------------------------------------------------------------------------

def _f64(values: object, n: int, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.shape != (n,):
        raise MessageError(f"{what}: {arr.size} values, expected {n}")
    return arr


def joint_state(*, names: Sequence[str], position: object = (), velocity: object = (), effort: object = (),
                stamp: float | None = None, frame_id: str = "") -> object:
    """A `sensor_msgs/JointState`; an omitted field stays empty, as ROS 2 allows."""
    fields = {}
    for key, values in (("position", position), ("velocity", velocity), ("effort", effort)):
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
        fields[key] = arr if arr.size == 0 else _f64(arr, len(names), f"JointState.{key}")
    return message_class(JOINT_STATE)(header=header(stamp=stamp, frame_id=frame_id), name=list(names),
                                      **fields)


def joint_state_arrays(msg: object, joints: Sequence[str]) -> dict[str, np.ndarray]:
    """Position/velocity/effort in the order of `joints`; empty fields are left out."""
    index = {name: i for i, name in enumerate(msg.name)}
    try:
        order = np.fromiter((index[j] for j in joints), dtype=np.intp, count=len(joints))
    except KeyError as exc:
        raise MessageError(f"joint {exc.args[0]!r} not in JointState.name {list(msg.name)}") from None
    out = {}
    for key in FIELDS[JOINT_STATE]:
        values = np.asarray(getattr(msg, key), dtype=np.float64)
        if values.size == 0:
            continue
        if values.shape != (len(index),):
            raise MessageError(f"JointState.{key} has {values.size} values for {len(index)} names")
        out[key] = values[order]
    return out


def image(array: np.ndarray, *, stamp: float | None = None, frame_id: str = "") -> object:
    """A `sensor_msgs/Image` from an HxWx3 (rgb8) or HxW / HxWx1 (mono8) uint8 array, no loops."""
    array = np.asarray(array)
    if array.dtype != np.uint8:
        raise MessageError(f"Image: dtype {array.dtype.name}, expected uint8")
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3):
        raise MessageError(f"Image: shape {list(array.shape)}, expected [H, W, 3] or [H, W, 1]")
    h, w, c = array.shape
    data = np.ascontiguousarray(array).reshape(-1)
    return message_class(IMAGE)(header=header(stamp=stamp, frame_id=frame_id), height=h, width=w,
                                encoding="rgb8" if c == 3 else "mono8", is_bigendian=0, step=w * c, data=data)


def image_array(msg: object) -> np.ndarray:
    """An HxWxC uint8 view over `msg.data` (rows padded to `step` are skipped by striding)."""
    channels = _CHANNELS.get(msg.encoding)
    if channels is None:
        raise MessageError(f"Image.encoding {msg.encoding!r} is not one of {sorted(_CHANNELS)}")
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    data = np.asarray(msg.data, dtype=np.uint8)
    if step < w * channels or data.size < h * step:
        raise MessageError(f"Image: {data.size} bytes with step {step} for {h}x{w} {msg.encoding}")
    view = data[: h * step].reshape(h, step)[:, : w * channels].reshape(h, w, channels)
    return view[:, :, ::-1] if msg.encoding == "bgr8" else view


def compressed_image(data: bytes, *, format: str = "jpeg", stamp: float | None = None, frame_id: str = "") -> object:
    """A `sensor_msgs/CompressedImage` holding a JPEG or PNG file's bytes (`format` as drivers write it:
    "jpeg", "png", or image_transport's "rgb8; jpeg compressed bgr8").

    >>> msg = deserialize(serialize(compressed_image(b"\\xff\\xd8 jpeg bytes")), COMPRESSED_IMAGE)
    >>> msg.format, compressed_format(msg), bytes(msg.data[:2])
    ('jpeg', 'jpeg', b'\\xff\\xd8')
    """
    return message_class(COMPRESSED_IMAGE)(header=header(stamp=stamp, frame_id=frame_id), format=format,
                                           data=np.frombuffer(bytes(data), np.uint8))


def compressed_format(msg: object) -> str:
    """'jpeg' or 'png': which file a CompressedImage holds, read from its `format` string."""
    text = msg.format.lower()
    for name, words in (("png", ("png",)), ("jpeg", ("jpeg", "jpg"))):
        if any(w in text for w in words):
            return name
    raise MessageError(f"CompressedImage.format {msg.format!r} is neither jpeg nor png")


def _vec3(v: object) -> list[float]:
    return [v.x, v.y, v.z]


def imu_arrays(msg: object) -> dict[str, np.ndarray]:
    """Orientation (x, y, z, w), angular velocity and linear acceleration of a `sensor_msgs/Imu`."""
    q = msg.orientation
    return {"orientation": np.array([q.x, q.y, q.z, q.w]),
            "angular_velocity": np.array(_vec3(msg.angular_velocity)),
            "linear_acceleration": np.array(_vec3(msg.linear_acceleration))}


def _vector3(values: np.ndarray) -> object:
    x, y, z = (float(v) for v in values)
    return TYPESTORE.types["geometry_msgs/msg/Vector3"](x=x, y=y, z=z)


def _quaternion(values: np.ndarray) -> object:
    x, y, z, w = (float(v) for v in values)
    return TYPESTORE.types["geometry_msgs/msg/Quaternion"](x=x, y=y, z=z, w=w)


def imu(*, orientation: object = (0, 0, 0, 1), angular_velocity: object = (0, 0, 0),
        linear_acceleration: object = (0, 0, 0), stamp: float | None = None, frame_id: str = "") -> object:
    """A `sensor_msgs/Imu` (covariances zero, i.e. unknown)."""
    zeros = np.zeros(9)
    return message_class(IMU)(
        header=header(stamp=stamp, frame_id=frame_id),
        orientation=_quaternion(_f64(orientation, 4, "Imu.orientation")), orientation_covariance=zeros,
        angular_velocity=_vector3(_f64(angular_velocity, 3, "Imu.angular_velocity")),
        angular_velocity_covariance=zeros,
        linear_acceleration=_vector3(_f64(linear_acceleration, 3, "Imu.linear_acceleration")),
        linear_acceleration_covariance=zeros)


def twist(values: object) -> object:
    """A `geometry_msgs/Twist` from (vx, vy, vz, wx, wy, wz)."""
    v = _f64(values, 6, "Twist")
    return message_class(TWIST)(linear=_vector3(v[:3]), angular=_vector3(v[3:]))


def twist_array(msg: object) -> np.ndarray:
    """(vx, vy, vz, wx, wy, wz) of a `geometry_msgs/Twist`."""
    return np.array(_vec3(msg.linear) + _vec3(msg.angular))


def odometry(*, pose: object, twist_values: object = (0,) * 6, stamp: float | None = None,
             frame_id: str = "odom", child_frame_id: str = "base_link") -> object:
    """A `nav_msgs/Odometry` from a pose (x, y, z, qx, qy, qz, qw) and a twist 6-vector."""
    p = _f64(pose, 7, "Odometry.pose")
    ts = TYPESTORE.types
    pose_msg = ts["geometry_msgs/msg/Pose"](
        position=ts["geometry_msgs/msg/Point"](x=float(p[0]), y=float(p[1]), z=float(p[2])),
        orientation=_quaternion(p[3:]))
    return message_class(ODOMETRY)(
        header=header(stamp=stamp, frame_id=frame_id), child_frame_id=child_frame_id,
        pose=ts["geometry_msgs/msg/PoseWithCovariance"](pose=pose_msg, covariance=np.zeros(36)),
        twist=ts["geometry_msgs/msg/TwistWithCovariance"](twist=twist(twist_values), covariance=np.zeros(36)))


def odometry_arrays(msg: object) -> dict[str, np.ndarray]:
    """Pose (x, y, z, qx, qy, qz, qw) and twist (vx, vy, vz, wx, wy, wz) of a `nav_msgs/Odometry`."""
    p, q = msg.pose.pose.position, msg.pose.pose.orientation
    return {"pose": np.array([p.x, p.y, p.z, q.x, q.y, q.z, q.w]), "twist": twist_array(msg.twist.twist)}


def float64_array(values: object) -> object:
    """A `std_msgs/Float64MultiArray` with an empty layout (what ros2_control command topics take)."""
    data = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
    layout = TYPESTORE.types["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
    return message_class(FLOAT64_ARRAY)(layout=layout, data=data)


def float64_msg(value: float) -> object:
    """A `std_msgs/Float64` (one joint's position target on a per-joint command topic).

    >>> deserialize(serialize(float64_msg(0.25)), FLOAT64).data
    0.25
    """
    value = float(value)
    if not math.isfinite(value):
        raise MessageError(f"Float64.data: {value} is not finite")
    return message_class(FLOAT64)(data=value)


def bool_msg(value: bool) -> object:
    """A `std_msgs/Bool`."""
    return message_class(BOOL)(data=bool(value))


def string_msg(text: str) -> object:
    """A `std_msgs/String`.

    >>> deserialize(serialize(string_msg("ada")), STRING).data
    'ada'
    """
    if not isinstance(text, str):
        raise MessageError(f"String.data: expected a str, got {text!r}")
    return message_class(STRING)(data=text)


# -- generic dispatch ----------------------------------------------------------------------------

def to_arrays(msg: object, *, joints: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """The array fields (`FIELDS[type]`) of a supported message; JointState needs `joints`."""
    name = supported_type(msg.__msgtype__)
    if name == JOINT_STATE:
        return joint_state_arrays(msg, joints)
    if name == IMAGE:
        return {"image": image_array(msg)}
    if name == COMPRESSED_IMAGE:  # the file's bytes; bridge.ros2.cameras makes its tensor
        return {"image": np.asarray(msg.data, np.uint8)}
    if name == IMU:
        return imu_arrays(msg)
    if name == TWIST:
        return {"twist": twist_array(msg)}
    if name == ODOMETRY:
        return odometry_arrays(msg)
    if name == FLOAT64_ARRAY:
        return {"data": np.asarray(msg.data, dtype=np.float64)}
    return {"data": np.array(float(msg.data) if name == FLOAT64 else bool(msg.data))}


def from_arrays(name: str, arrays: Mapping[str, np.ndarray], *, joints: Sequence[str] = (),
                stamp: float | None = None) -> object:
    """A supported message from its array fields (inverse of `to_arrays`); extra keys are errors.

    >>> from_arrays(TWIST, {"twist": np.arange(6.0)}).angular.z
    5.0
    """
    name = supported_type(name)
    unknown = set(arrays) - set(FIELDS[name])
    if unknown:
        raise MessageError(f"{name} has no field {sorted(unknown)[0]!r}; fields: {list(FIELDS[name])}")

    def need(key: str) -> np.ndarray:
        if key not in arrays:
            raise MessageError(f"{name} needs field {key!r}")
        return np.asarray(arrays[key])

    if name == JOINT_STATE:
        return joint_state(names=joints, stamp=stamp, **arrays)
    if name == IMAGE:
        return image(need("image"), stamp=stamp)
    if name == COMPRESSED_IMAGE:  # the file's bytes: PNG by its signature, else JPEG
        data = np.asarray(need("image"), np.uint8).tobytes()
        return compressed_image(data, format="png" if data.startswith(b"\x89PNG") else "jpeg", stamp=stamp)
    if name == IMU:
        return imu(stamp=stamp, **arrays)
    if name == TWIST:
        return twist(need("twist"))
    if name == ODOMETRY:
        return odometry(pose=need("pose"), twist_values=arrays.get("twist", np.zeros(6)), stamp=stamp)
    if name == FLOAT64_ARRAY:
        return float64_array(need("data"))
    value = need("data")
    if value.size != 1:
        raise MessageError(f"{name}.data: {value.size} values, expected 1")
    return float64_msg(value.reshape(-1)[0]) if name == FLOAT64 else bool_msg(bool(value.reshape(-1)[0]))


def field_shape(name: str, field: str, *, joints: Sequence[str] = ()) -> tuple[int, ...] | None:
    """The array shape of `field`, or None where only the topic map can say (images, arrays).

    >>> field_shape(JOINT_STATE, "velocity", joints=["a", "b"]), field_shape(IMU, "orientation")
    ((2,), (4,))
    """
    name = supported_type(name)
    if field not in FIELDS[name]:
        raise MessageError(f"{name} has no field {field!r}; fields: {list(FIELDS[name])}")
    if name == JOINT_STATE:
        return (len(joints),)
    fixed = {"orientation": (4,), "angular_velocity": (3,), "linear_acceleration": (3,),
             "twist": (6,), "pose": (7,)}
    return () if name in (BOOL, FLOAT64) else fixed.get(field)


def field_dtype(name: str, field: str) -> np.dtype:
    """The numpy dtype `to_arrays` returns for `field` of a supported type."""
    name = supported_type(name)
    return np.dtype(np.uint8 if name in (IMAGE, COMPRESSED_IMAGE) else bool if name == BOOL else np.float64)
