"""One message of every supported type, with values that exercise alignment and padding."""

from __future__ import annotations

import numpy as np

from bridge.ros2 import messages as m

SAMPLES = (
    m.joint_state(names=["a", "bb", "ccc"], position=[0.1, -0.2, 0.3], velocity=[1.0, 2.0, 3.0],
                  stamp=1.25, frame_id="base"),
    m.joint_state(names=["only_names"], stamp=0.0),
    m.image(np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3), stamp=2.5, frame_id="cam"),
    m.image(np.arange(3 * 7, dtype=np.uint8).reshape(3, 7), frame_id="mono"),
    m.compressed_image(b"\xff\xd8\xff\xe0 not a whole JPEG, 29 bytes", format="jpeg", stamp=2.75, frame_id="cam"),
    m.imu(orientation=[0.0, 0.0, 0.6, 0.8], angular_velocity=[0.1, 0.2, 0.3],
          linear_acceleration=[0.0, 0.0, 9.81], stamp=3.5, frame_id="imu"),
    m.twist([0.5, 0.0, 0.0, 0.0, 0.0, -0.25]),
    m.odometry(pose=[1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 1.0], twist_values=np.arange(6.0), stamp=4.0,
               frame_id="odom", child_frame_id="base_footprint"),
    m.float64_array([1.0, 2.0, 3.0]),
    m.float64_array([]),
    m.float64_msg(-0.1),
    m.bool_msg(True),
    m.bool_msg(False),
)
