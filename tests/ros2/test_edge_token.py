"""The edge node against a gateway that checks tokens (real gateway, real Triton, a Cyclone DDS robot
process on loopback): with a robot token its session runs and is counted under the token's identity;
without one, or with a viewer's, the node never gets a session and no policy command reaches the robot."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from bridge.ros2.edge_config import EdgeConfig, EdgeConfigError
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map
from bridge.security.tokens import TokenStore
from tests.ros2.edge_support import Robot, const, echo_gateway, running_edge, wait_until

TMAP = load_topic_map(DEFAULT_TOPIC_MAP)
JOINTS = TMAP.observation[0].joints


@pytest.fixture(scope="module")
def token_gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("edge_token")
    store = TokenStore(root / "tokens.json")
    tokens = {"arm_1": store.add("arm_1", role="robot"), "bob": store.add("bob", role="viewer")}
    with echo_gateway(root, tokens=root / "tokens.json") as gw:
        yield gw, gw.address, tokens


def test_a_robot_token_opens_the_edge_nodes_session_and_nothing_else_does(ros_domain, token_gateway, caplog):
    gw, address, tokens = token_gateway
    robot = Robot(ros_domain, JOINTS)
    robot.wait_ready()
    try:
        for what, config in (("no token", {}), ("a viewer's token", {"token": tokens["bob"]})):
            t = time.monotonic()
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="tether.edge.link"), \
                    running_edge(ros_domain, address, TMAP, policy="echo6", config=config) as node:
                robot.send("const 0.25")
                wait_until(lambda: sum("reconnecting" in r.getMessage() for r in caplog.records) >= 2, timeout=60,
                           what=f"two refused connection attempts with {what}")
                assert node.stats.connects == 0 and not gw.gateway.sessions, what
            assert not any(np.allclose(c["data"], 0.25) for c in robot.since(t)), what  # nothing reached it
        with running_edge(ros_domain, address, TMAP, policy="echo6", config={"token": tokens["arm_1"]}) as node:
            const(robot, 0.25, timeout=30,
                  what="a command echoing the robot's velocity through the token-checking gateway")
            assert gw.gateway.admission.by_source() == {"robot:arm_1": 1}
            assert node.stats.connects == 1
    finally:
        robot.close()


def test_a_token_is_never_sent_in_plaintext_off_loopback():
    with pytest.raises(EdgeConfigError, match="plaintext"):
        EdgeConfig(gateway="10.0.0.5:50051", token="arm_1.secret")
    config = EdgeConfig(gateway="127.0.0.1:50051", token="arm_1.secret")
    assert config.credentials().metadata() == (("authorization", "Bearer arm_1.secret"),)
    with pytest.raises(EdgeConfigError, match="plaintext"):         # every address of a failover list
        EdgeConfig(gateway="127.0.0.1:50051,10.0.0.5:50051", token="arm_1.secret")
    assert "secret" not in repr(config)
