"""A camera robot on rclpy (ROS 2 Jazzy, Fast DDS) for tests/ros2/test_edge_cameras.py: its own process from the
ROS environment (.venv/ros), with rclpy's own message classes and nothing of Tether's.

At --hz it publishes sensor_msgs/JointState (--joints, positions 0) on /joint_states, the current JPEG file's
bytes as a sensor_msgs/CompressedImage (format "rgb8; jpeg compressed bgr8", as image_transport writes) on
/wrist/image/compressed, and the current raw frame (an .npy file of uint8 HxWx3 RGB) as a bgr8
sensor_msgs/Image on /front/image_raw, all best effort. Every std_msgs/Float64MultiArray on
/policy_controller/commands is printed as {"data": [...]}. stdin lines: `frame JPEG NPY` switches the
frames; it prints {"event": "ready"} once the first frame is set, and stops when stdin closes.

    .venv/ros/bin/python tests/ros2/rclpy_camera_robot.py --joints j0,j1 --hz 50
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import CompressedImage, Image, JointState
    from std_msgs.msg import Float64MultiArray

    parser = argparse.ArgumentParser()
    parser.add_argument("--joints", required=True)
    parser.add_argument("--hz", type=float, default=50.0)
    a = parser.parse_args(argv)
    joints = a.joints.split(",")
    rclpy.init()
    node = rclpy.create_node("camera_robot")
    best_effort = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
    states = node.create_publisher(JointState, "/joint_states", best_effort)
    wrist = node.create_publisher(CompressedImage, "/wrist/image/compressed", best_effort)
    front = node.create_publisher(Image, "/front/image_raw", best_effort)
    out = threading.Lock()

    def command(msg: Float64MultiArray) -> None:
        with out:
            print(json.dumps({"data": list(msg.data)}), flush=True)

    node.create_subscription(Float64MultiArray, "/policy_controller/commands", command,
                             QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
    current: list[tuple[bytes, np.ndarray]] = []   # (JPEG bytes, RGB frame), replaced as one

    def tick() -> None:
        if not current:
            return
        data, rgb = current[-1]
        stamp = node.get_clock().now().to_msg()
        states.publish(JointState(name=joints, position=[0.0] * len(joints)))
        jpeg = CompressedImage(format="rgb8; jpeg compressed bgr8")
        jpeg.header.stamp = stamp
        jpeg.data = data
        wrist.publish(jpeg)
        h, w, _ = rgb.shape
        image = Image(height=h, width=w, encoding="bgr8", is_bigendian=0, step=w * 3)
        image.header.stamp = stamp
        image.data = np.ascontiguousarray(rgb[:, :, ::-1]).tobytes()
        front.publish(image)

    node.create_timer(1.0 / a.hz, tick)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [executor.spin_once(timeout_sec=0.05) for _ in
                                               iter(stop.is_set, True)], daemon=True)
    spinner.start()
    try:
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["frame"]:
                current.append((Path(words[1]).read_bytes(), np.load(words[2], allow_pickle=False)))
                with out:
                    print(json.dumps({"event": "ready"}), flush=True)
    finally:
        stop.set()                     # the spinner ends before the executor and node go
        spinner.join(timeout=5)
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
