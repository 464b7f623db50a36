"""The rclpy transport: run where ROS 2 is sourced; here only the choice of transport is checked."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bridge.ros2 import messages
from bridge.ros2.dds import DdsTransport
from bridge.ros2.transport import TransportError, open_transport, rclpy_available, wait_for_subscribers

needs_rclpy = pytest.mark.skipif(not rclpy_available(), reason="rclpy not installed")


@pytest.mark.skipif(rclpy_available(), reason="rclpy is installed: auto picks it")
def test_auto_falls_back_to_dds_and_rclpy_says_why_not(ros_domain):
    with open_transport("auto", domain_id=ros_domain) as transport:
        assert isinstance(transport, DdsTransport)
    with pytest.raises(TransportError, match="rclpy is not importable"):
        open_transport("rclpy", domain_id=ros_domain)


@needs_rclpy
def test_auto_prefers_rclpy(ros_domain):
    from bridge.ros2.rclpy_transport import RclpyTransport

    transport = open_transport("auto", domain_id=ros_domain)
    try:
        assert isinstance(transport, RclpyTransport)
    finally:
        transport.close()


@needs_rclpy
def test_rclpy_round_trip_in_order(ros_domain):
    from bridge.ros2.rclpy_transport import RclpyTransport

    got = []
    with RclpyTransport(domain_id=ros_domain, node_name="tether_test") as transport:
        transport.subscribe("/joint_states", messages.JOINT_STATE, got.append, reliable=True, depth=50)
        pub = transport.publisher("/joint_states", messages.JOINT_STATE, depth=50)
        assert wait_for_subscribers(pub, timeout=10)
        for i in range(20):
            pub(messages.joint_state(names=["a", "b"], position=[i, -i], stamp=i))
        deadline = time.monotonic() + 10
        while len(got) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert [messages.stamp_of(m) for m in got] == list(range(20))
    np.testing.assert_array_equal(messages.joint_state_arrays(got[3], ["b", "a"])["position"], [-3, 3])


@needs_rclpy
def test_rclpy_errors(ros_domain):
    from bridge.ros2.rclpy_transport import RclpyTransport

    with RclpyTransport(domain_id=ros_domain) as transport:
        pub = transport.publisher("/flag", messages.BOOL)
        with pytest.raises(TransportError, match="/flag publishes std_msgs/msg/Bool"):
            pub(messages.twist(np.zeros(6)))
        with pytest.raises(TransportError, match="already carries"):
            transport.subscribe("/flag", messages.TWIST, print)
