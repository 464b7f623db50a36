"""Message definitions and converters: CDR identical to cyclonedds, round trips, zero-copy images."""

from __future__ import annotations

import numpy as np
import pytest

from bridge.ros2 import messages as m
from bridge.ros2.dds import idl_type, to_idl
from tests.ros2.samples import SAMPLES

IDS = [f"{s.__msgtype__.rsplit('/', 1)[1]}{i}" for i, s in enumerate(SAMPLES)]


def padded(raw: memoryview) -> bytes:
    return bytes(raw) + bytes(-len(raw) % 4)


def test_every_supported_type_has_a_sample():
    assert {s.__msgtype__ for s in SAMPLES} == set(m.SUPPORTED)


@pytest.mark.parametrize("msg", SAMPLES, ids=IDS)
def test_cdr_is_byte_identical_to_cyclonedds(msg):
    ours = m.serialize(msg)
    assert bytes(ours[:4]) == b"\x00\x01\x00\x00"  # CDR_LE, what ROS 2 writes
    theirs = to_idl(msg).serialize()
    assert padded(ours) == padded(theirs)
    assert idl_type(msg.__msgtype__).deserialize(bytes(ours)) == to_idl(msg)


@pytest.mark.parametrize("msg", SAMPLES, ids=IDS)
def test_cdr_round_trip(msg):
    raw = padded(m.serialize(msg))  # as taken from the wire, with cyclonedds' padding
    back = m.deserialize(raw, msg.__msgtype__)
    assert padded(m.serialize(back)) == raw
    joints = getattr(msg, "name", ())
    before, after = m.to_arrays(msg, joints=joints), m.to_arrays(back, joints=joints)
    assert before.keys() == after.keys()
    for key in before:
        np.testing.assert_array_equal(before[key], after[key])
        shape = m.field_shape(msg.__msgtype__, key, joints=joints)
        assert shape is None or after[key].shape == shape
        assert after[key].dtype == m.field_dtype(msg.__msgtype__, key)


@pytest.mark.parametrize("msg", SAMPLES, ids=IDS)
def test_from_arrays_inverts_to_arrays(msg):
    joints = getattr(msg, "name", ())
    arrays = m.to_arrays(msg, joints=joints)
    again = m.from_arrays(msg.__msgtype__, arrays, joints=joints, stamp=m.stamp_of(msg))
    for key, value in m.to_arrays(again, joints=joints).items():
        np.testing.assert_array_equal(value, arrays[key])


def test_type_names():
    assert m.ros_type("sensor_msgs/Image") == m.IMAGE
    assert m.dds_type_name(m.ODOMETRY) == "nav_msgs::msg::dds_::Odometry_"
    assert idl_type(m.JOINT_STATE).__idl_typename__ == "sensor_msgs::msg::dds_::JointState_"
    with pytest.raises(m.MessageError, match="unknown ROS 2 message type 'foo/msg/Bar'"):
        m.ros_type("foo/Bar")
    with pytest.raises(m.MessageError, match="no converter"):
        m.supported_type("std_msgs/msg/String")


def test_large_image_is_a_view_over_the_received_bytes():
    pixels = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    raw = padded(m.serialize(m.image(pixels)))
    view = m.image_array(m.deserialize(raw, m.IMAGE))
    assert view.shape == (480, 640, 3) and not view.flags.writeable
    assert np.shares_memory(view, np.frombuffer(raw, np.uint8))  # no copy, no per-pixel Python
    np.testing.assert_array_equal(view, pixels)


def test_image_rows_padded_to_step_and_mono():
    msg = m.image(np.zeros((2, 3), np.uint8))
    padded_rows = np.arange(2 * 4, dtype=np.uint8)  # step 4 > width 3: one padding byte per row
    msg = type(msg)(header=msg.header, height=2, width=3, encoding="mono8", is_bigendian=0, step=4,
                    data=padded_rows)
    assert m.image_array(msg)[:, :, 0].tolist() == [[0, 1, 2], [4, 5, 6]]
    with pytest.raises(m.MessageError, match="'bgr16'"):
        m.image_array(type(msg)(header=msg.header, height=2, width=3, encoding="bgr16", is_bigendian=0,
                                step=4, data=padded_rows))
    with pytest.raises(m.MessageError, match="uint8"):
        m.image(np.zeros((2, 2, 3), np.float32))


def test_joint_state_order_and_errors():
    msg = m.joint_state(names=["a", "b", "c"], position=[1.0, 2.0, 3.0], effort=[4.0, 5.0, 6.0])
    arrays = m.joint_state_arrays(msg, ["c", "a"])
    assert arrays["position"].tolist() == [3.0, 1.0] and arrays["effort"].tolist() == [6.0, 4.0]
    assert "velocity" not in arrays  # empty in the message
    with pytest.raises(m.MessageError, match="joint 'z' not in JointState.name"):
        m.joint_state_arrays(msg, ["a", "z"])
    with pytest.raises(m.MessageError, match="JointState.position: 2 values, expected 3"):
        m.joint_state(names=["a", "b", "c"], position=[1.0, 2.0])
    with pytest.raises(m.MessageError, match="no field 'torque'"):
        m.from_arrays(m.JOINT_STATE, {"torque": np.zeros(3)}, joints=["a", "b", "c"])


def test_small_converters():
    assert m.twist_array(m.twist(np.arange(6.0))).tolist() == [0, 1, 2, 3, 4, 5]
    odom = m.odometry_arrays(m.odometry(pose=np.arange(7.0)))
    assert odom["pose"].tolist() == list(range(7)) and odom["twist"].tolist() == [0] * 6
    imu = m.imu_arrays(m.imu(orientation=[0, 0, 0, 1], angular_velocity=[1, 2, 3]))
    assert imu["orientation"].tolist() == [0, 0, 0, 1] and imu["angular_velocity"].tolist() == [1, 2, 3]
    assert m.to_arrays(m.bool_msg(True))["data"].shape == ()
    assert m.stamp_of(m.joint_state(names=[], stamp=12.000000001)) == pytest.approx(12.000000001)
    assert m.stamp_of(m.float64_array([1.0])) is None
