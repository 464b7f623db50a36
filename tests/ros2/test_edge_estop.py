"""`tether edge estop|release` against a running edge node, on the DDS wire (no gateway needed:
the e-stop is the guard's, and the guard works without the network)."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from bridge.ros2 import messages
from bridge.ros2.dds import DdsTransport
from bridge.ros2.edge import main
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map
from tests.ros2.edge_support import running_edge, wait_until

TMAP = load_topic_map(DEFAULT_TOPIC_MAP)


def dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_cli_estop_and_release_confirmed_by_the_node(ros_domain, capsys):
    commands = []
    with DdsTransport(domain_id=ros_domain, node_name="robot") as robot, \
            running_edge(ros_domain, dead_address(), TMAP, policy="none", safe_action="zero") as node:
        robot.subscribe("/policy_controller/commands", messages.FLOAT64_ARRAY, commands.append, reliable=True)
        command_publisher = node._publishers["/policy_controller/commands"]
        wait_until(lambda: command_publisher.subscriber_count() >= 1, timeout=10, what="the robot's subscription")
        time.sleep(0.2)                             # matched: a command in these 0.2 s would have arrived
        assert commands == []                       # never commanded: nothing to make safe
        main(["estop", "--operator", "ada", "--domain-id", str(ros_domain), "--transport", "dds"])
        assert node.guard.estopped                  # main returned: the node confirmed the latch
        assert "e-stop latched by ada" in capsys.readouterr().out
        wait_until(lambda: len(commands) >= 5, timeout=5, what="safe commands while e-stopped")
        assert all(np.array_equal(c.data, np.zeros(6)) for c in commands)
        main(["release", "--operator", "ada", "--domain-id", str(ros_domain), "--transport", "dds"])
        assert not node.guard.estopped and node.guard.counts.estop == 1
        assert "e-stop released by ada" in capsys.readouterr().out
        n = len(commands)
        time.sleep(0.1)
        assert len(commands) == n                   # released, no policy: the node stays silent


def test_release_needs_an_allowed_operator(ros_domain, caplog):
    with running_edge(ros_domain, dead_address(), TMAP, policy="none", safe_action="zero") as node:
        main(["estop", "--operator", "ada", "--domain-id", str(ros_domain), "--transport", "dds"])
        with pytest.raises(SystemExit, match="no edge node confirmed a release by 'mallory'"):
            main(["release", "--operator", "mallory", "--reason", "in a hurry", "--domain-id", str(ros_domain),
                  "--transport", "dds", "--timeout", "0.5"])
        assert node.guard.estopped and node.stats.errors["RELEASE_REFUSED"] >= 1
        main(["release", "--operator", "ada", "--reason", "cell clear", "--domain-id", str(ros_domain),
              "--transport", "dds"])
        assert not node.guard.estopped
    assert "e-stop release by 'mallory' (in a hurry) refused" in caplog.text
    assert "e-stop released by ada: cell clear" in caplog.text


def test_false_and_nameless_release_do_not_release(ros_domain):
    with DdsTransport(domain_id=ros_domain, node_name="operator") as operator, \
            running_edge(ros_domain, dead_address(), TMAP, policy="none", safe_action="zero") as node:
        estop = operator.publisher("/tether/estop", messages.BOOL)
        release = operator.publisher("/tether/estop_release", messages.STRING)
        states = []
        operator.subscribe("/tether/estop_state", messages.BOOL, lambda m: states.append(m.data), reliable=True)
        wait_until(lambda: estop.subscriber_count() and release.subscriber_count(), timeout=10, what="the node")
        estop(messages.bool_msg(True))
        wait_until(lambda: node.guard.estopped, timeout=5, what="the latch")
        estop(messages.bool_msg(False))
        release(messages.string_msg(""))
        wait_until(lambda: states.count(True) >= 3, timeout=5, what="the node answering each message")
        assert node.guard.estopped and False not in states[states.index(True):]


def test_cli_errors_name_the_problem(ros_domain, capsys):
    with pytest.raises(SystemExit, match="no edge node confirmed a release by 'ada'"):
        main(["release", "--operator", "ada", "--domain-id", str(ros_domain), "--transport", "dds",
              "--timeout", "0.3"])
    with pytest.raises(SystemExit) as exc:
        main(["release", "--operator", "  ", "--domain-id", str(ros_domain)])
    assert exc.value.code == 2 and "--operator: expected a non-empty name without ':'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--gateway", "127.0.0.1:1", "--rate", "0", "--domain-id", str(ros_domain)])
    assert exc.value.code == 2 and "rate_hz: expected a number of Hz in (0, 2000], got 0.0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--gateway", "127.0.0.1:1", "--safe-action", "9", "--domain-id", str(ros_domain)])
    assert exc.value.code == 2 and "safe_action" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--gateway", "no-port", "--domain-id", str(ros_domain)])
    assert exc.value.code == 2 and "gateway: expected HOST:PORT, got 'no-port'" in capsys.readouterr().err
