"""The edge node over mTLS: a robot's certificate is its identity at the gateway (real gateway, real
Triton, a Cyclone DDS robot process on loopback). Without a client certificate the node never gets
a session, and no policy command reaches the robot."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from bridge.ros2.edge_config import EdgeConfig, EdgeConfigError
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map
from tests.ros2.edge_support import Robot, const, echo_gateway, running_edge, wait_until
from tests.security.helpers import make_certs

TMAP = load_topic_map(DEFAULT_TOPIC_MAP)
JOINTS = TMAP.observation[0].joints


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def mtls_gateway(tmp_path_factory, certs):
    with echo_gateway(tmp_path_factory.mktemp("edge_tls"), tls_cert=certs / "server.crt",
                      tls_key=certs / "server.key", tls_client_ca=certs / "ca.crt") as gw:
        yield gw, gw.address


def test_a_robot_over_mtls_is_known_by_its_certificate(ros_domain, certs, mtls_gateway, caplog):
    gw, address = mtls_gateway
    robot = Robot(ros_domain, JOINTS)
    robot.wait_ready()
    tls = {"tls_ca": certs / "ca.crt", "tls_cert": certs / "arm_1.crt", "tls_key": certs / "arm_1.key"}
    try:
        with running_edge(ros_domain, address, TMAP, policy="echo6", config=tls) as node:
            const(robot, 0.25, timeout=30, what="a command echoing the robot's velocity through the mTLS gateway")
            assert gw.gateway.admission.by_source() == {"robot:arm_1": 1}
            assert node.stats.connects == 1
        t = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="tether.edge.link"), \
                running_edge(ros_domain, address, TMAP, policy="echo6", config={"tls_ca": certs / "ca.crt"}) as node:
            wait_until(lambda: sum("reconnecting" in r.getMessage() for r in caplog.records) >= 2, timeout=60,
                       what="two refused connection attempts without a client certificate")
            assert node.stats.connects == 0 and not gw.gateway.sessions
        assert not any(np.allclose(c["data"], 0.25) for c in robot.since(t))   # no policy command reached it
    finally:
        robot.close()


def test_tls_settings_are_checked_early(certs, tmp_path):
    with pytest.raises(EdgeConfigError, match="tls_ca"):
        EdgeConfig(gateway="127.0.0.1:1", tls_cert=certs / "arm_1.crt", tls_key=certs / "arm_1.key")
    with pytest.raises(EdgeConfigError, match="no such file"):
        EdgeConfig(gateway="127.0.0.1:1", tls_ca=tmp_path / "missing.crt")
    assert EdgeConfig(gateway="127.0.0.1:1").credentials().channel_credentials() is None     # plaintext
