"""Every test here gets its own DDS domain, pinned to loopback before any participant exists."""

from __future__ import annotations

import itertools
import random

import pytest

from bridge.ros2.dds import loopback_config

# A random walk over all valid ids: concurrent test runs rarely share one, and a long session
# cycles instead of running out (earlier tests have closed their participants by then).
_DOMAINS = itertools.cycle(random.SystemRandom().sample(range(1, 233), 232))


@pytest.fixture(autouse=True)
def ros_domain(monkeypatch) -> int:
    """A fresh domain id (also `ROS_DOMAIN_ID`) with a loopback-only `CYCLONEDDS_URI`."""
    domain = next(_DOMAINS)
    monkeypatch.setenv("CYCLONEDDS_URI", loopback_config(domain))
    monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
    return domain
