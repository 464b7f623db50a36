"""Every test here gets its own DDS domain, pinned to loopback before any participant exists; `robot`
is the edge tests' robot process on it (tests/ros2/edge_robot.py, the default topic map's joints)."""

from __future__ import annotations

import itertools
import os
import random

import pytest

from bridge.ros2.dds import loopback_config

# A random walk over the valid ids, each xdist worker on its own share (worker i of n: the ids = i + 1 mod n):
# concurrent test runs rarely share one, and a long session cycles instead of running out (earlier tests have
# closed their participants by then).
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_OURS = [d for d in range(1, 233) if d % _WORKERS == (_WORKER + 1) % _WORKERS]
_DOMAINS = itertools.cycle(random.SystemRandom().sample(_OURS, len(_OURS)))


@pytest.fixture(autouse=True)
def ros_domain(monkeypatch) -> int:
    """A fresh domain id (also `ROS_DOMAIN_ID`) with a loopback-only `CYCLONEDDS_URI`."""
    domain = next(_DOMAINS)
    monkeypatch.setenv("CYCLONEDDS_URI", loopback_config(domain))
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    return domain


@pytest.fixture
def robot(ros_domain):
    """The Cyclone DDS robot (edge_support.Robot) with the default topic map's joints, ready; closed after the test."""
    from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map
    from tests.ros2.edge_support import Robot  # torch and the gateway: only for the tests that use it

    robot = Robot(ros_domain, load_topic_map(DEFAULT_TOPIC_MAP).observation[0].joints)
    robot.wait_ready()
    yield robot
    robot.close()
