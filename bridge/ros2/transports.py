"""Which `Transport` (bridge.ros2.transport): rclpy on a robot with a sourced ROS 2, otherwise Cyclone DDS
speaking the ROS 2 wire itself. The implementations import the contract; only this module imports them.

    transport = open_transport("auto", domain_id=0, node_name="tether_edge")   # rclpy if it imports, else DDS

    >>> try:
    ...     open_transport("zeromq")
    ... except TransportError as exc:
    ...     print(exc)
    transport kind 'zeromq' is not one of ['auto', 'dds', 'rclpy']
"""

from __future__ import annotations

import importlib.util

from bridge.ros2.rclpy_transport import RclpyTransport
from bridge.ros2.transport import Transport, TransportError

__all__ = ["open_transport", "rclpy_available"]


def rclpy_available() -> bool:
    """Whether rclpy can be imported here (a sourced ROS 2 installation)."""
    return importlib.util.find_spec("rclpy") is not None


def open_transport(kind: str = "auto", *, domain_id: int = 0, node_name: str = "tether_edge") -> Transport:
    """`"rclpy"`, `"dds"`, or `"auto"`: rclpy when it imports, otherwise DDS directly."""
    if kind not in ("auto", "dds", "rclpy"):
        raise TransportError(f"transport kind {kind!r} is not one of ['auto', 'dds', 'rclpy']")
    if not isinstance(domain_id, int) or not 0 <= domain_id <= 232:
        raise TransportError(f"domain_id {domain_id!r} must be an integer in [0, 232]")
    if kind == "rclpy" or (kind == "auto" and rclpy_available()):
        return RclpyTransport(domain_id=domain_id, node_name=node_name)
    from bridge.ros2.dds import DdsTransport  # cyclonedds: loaded only where DDS is used

    return DdsTransport(domain_id=domain_id, node_name=node_name)
