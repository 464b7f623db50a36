"""`tether edge estop|release|token` against a running edge node, on the DDS wire (no gateway needed:
the e-stop is the guard's, and the guard works without the network). A release needs the
operator's token (bridge.ros2.release_auth): the wire carries a MAC, never the token, and the node
refuses a release that is not its own, not fresh, not valid or already used."""

from __future__ import annotations

import logging
import socket

import numpy as np
import pytest

from bridge.common.errors import CommandError
from bridge.ros2 import messages
from bridge.ros2.dds import DdsTransport
from bridge.ros2.edge import main
from bridge.ros2.release_auth import TOKEN_ENV, add_operator
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, load_topic_map
from tests.ros2.edge_support import release_token, running_edge, wait_until

TMAP = load_topic_map(DEFAULT_TOPIC_MAP)
NODE = "edge_under_test"            # running_edge's node name


def dead_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def tokens(tmp_path):
    """The node's release tokens file with operator "ada"; (path, ada's token file)."""
    (tmp_path / "node").mkdir()
    path, token = release_token(tmp_path / "node")
    token_file = tmp_path / "ada.token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    return path, token_file


def cli(*args: str, domain: int) -> None:
    main([*args, "--domain-id", str(domain), "--transport", "dds"])


def test_cli_estop_and_release_confirmed_by_the_node(ros_domain, tokens, capsys):
    path, token_file = tokens
    commands, wire = [], []
    with DdsTransport(domain_id=ros_domain, node_name="robot") as robot, \
            running_edge(ros_domain, dead_address(), TMAP, policy="none", safe_action="zero",
                         config={"release_tokens": path}) as node:
        robot.subscribe("/policy_controller/commands", messages.FLOAT64_ARRAY, commands.append, reliable=True)
        robot.subscribe("/tether/estop_release", messages.STRING, lambda m: wire.append(m.data), reliable=True)
        command_publisher = node._publishers["/policy_controller/commands"]
        wait_until(lambda: command_publisher.subscriber_count() >= 1, timeout=10, what="the robot's subscription")
        ticks = node.stats.ticks                    # matched: wait on state, 20 control periods, not a sleep
        wait_until(lambda: node.stats.ticks >= ticks + 20, timeout=10, what="20 control periods")
        assert node.stats.commands == 0 and commands == []  # never commanded: nothing to make safe
        cli("estop", "--operator", "ada", domain=ros_domain)
        assert node.guard.estopped                  # main returned: the node confirmed the latch
        assert "e-stop latched by ada" in capsys.readouterr().out
        wait_until(lambda: len(commands) >= 5, timeout=5, what="safe commands while e-stopped")
        assert all(np.array_equal(c.data, np.zeros(6)) for c in commands)
        cli("release", "--operator", "ada", "--token-file", str(token_file), "--node", NODE, "--reason", "cell clear",
            domain=ros_domain)
        assert not node.guard.estopped and node.guard.counts.estop == 1
        assert "e-stop released by ada" in capsys.readouterr().out
        ticks = node.stats.ticks                    # a period that began latched has ended once 2 more began
        wait_until(lambda: node.stats.ticks >= ticks + 2, timeout=10, what="2 control periods")
        published, ticks = node.stats.commands, node.stats.ticks
        wait_until(lambda: node.stats.ticks >= ticks + 20, timeout=10, what="20 control periods after the release")
        assert node.stats.commands == published     # released, no policy: the node stays silent
    token = token_file.read_text().strip()
    assert wire and all(token not in text and token.split(".", 1)[1] not in text for text in wire)
    assert all(text.startswith(f"ada|{NODE}|") and "|cell clear|" in text for text in wire)


def test_release_needs_a_valid_fresh_credential_for_this_node(ros_domain, tokens, tmp_path, caplog, monkeypatch):
    """A wrong token, a release meant for another node, and a release sniffed off the wire and
    published again: each refused and counted, the e-stop held; the right token releases."""
    caplog.set_level(logging.WARNING, logger="tether.edge")
    path, token_file = tokens
    mallory = tmp_path / "mallory.token"
    mallory.write_text(add_operator(tmp_path / "elsewhere.json", "ada") + "\n")   # "ada" of another robot
    sniffed = []
    with DdsTransport(domain_id=ros_domain, node_name="sniffer") as sniffer, \
            running_edge(ros_domain, dead_address(), TMAP, policy="none", safe_action="zero",
                         config={"release_tokens": path}) as node:
        sniffer.subscribe("/tether/estop_release", messages.STRING, lambda m: sniffed.append(m.data), reliable=True)
        cli("estop", "--operator", "ada", domain=ros_domain)
        with pytest.raises(CommandError, match="no edge node confirmed a release of 'edge_under_test' by 'ada'"):
            cli("release", "--operator", "ada", "--token-file", str(mallory), "--node", NODE, "--timeout", "0.5",
                domain=ros_domain)
        with pytest.raises(CommandError, match="no edge node confirmed a release of 'arm_9' by 'ada'"):
            cli("release", "--operator", "ada", "--token-file", str(token_file), "--node", "arm_9", "--timeout",
                "0.5", domain=ros_domain)
        assert node.guard.estopped and node.stats.errors["RELEASE_REFUSED"] >= 2
        monkeypatch.setenv(TOKEN_ENV, token_file.read_text().strip())      # the token from the environment
        sniffed.clear()
        cli("release", "--operator", "ada", "--node", NODE, "--reason", "cell clear", domain=ros_domain)
        assert not node.guard.estopped
        wait_until(lambda: sniffed, timeout=5, what="the sniffer seeing the release")
        cli("estop", "--operator", "ada", domain=ros_domain)
        refused = node.stats.errors["RELEASE_REFUSED"]
        replay = sniffer.publisher("/tether/estop_release", messages.STRING, reliable=True)
        # >= 2: the sniffer's own reader matches at once; the node's must match too before anything is replayed
        wait_until(lambda: replay.subscriber_count() >= 2, timeout=10, what="the node's release subscription")
        captured = list(sniffed)                   # (the sniffer hears its own replays too)
        for text in captured:
            replay(messages.string_msg(text))
        wait_until(lambda: node.stats.errors["RELEASE_REFUSED"] >= refused + len(captured), timeout=5,
                   what="the node refusing every replayed release")
        assert node.guard.estopped
    assert "refused (bad mac" in caplog.text
    assert "refused (wrong node: release by 'ada' is for node 'arm_9', this is 'edge_under_test')" in caplog.text
    assert "refused (replayed: this release (by 'ada') was accepted once already)" in caplog.text
    assert "e-stop released by ada: cell clear" in caplog.text


def test_a_node_without_release_tokens_refuses_every_release(ros_domain, tokens, caplog):
    caplog.set_level(logging.WARNING, logger="tether.edge")
    _, token_file = tokens
    with running_edge(ros_domain, dead_address(), TMAP, policy="none", safe_action="zero") as node:
        cli("estop", "--operator", "ada", domain=ros_domain)
        with pytest.raises(CommandError, match="no edge node confirmed a release"):
            cli("release", "--operator", "ada", "--token-file", str(token_file), "--node", NODE, "--timeout", "0.5",
                domain=ros_domain)
        assert node.guard.estopped and node.stats.errors["RELEASE_REFUSED"] >= 1
    assert "not configured: this node has no release tokens file" in caplog.text
    assert "--release-tokens FILE" in caplog.text


def test_false_bare_name_and_empty_releases_do_not_release(ros_domain, tokens):
    path, _ = tokens
    with DdsTransport(domain_id=ros_domain, node_name="operator") as operator, \
            running_edge(ros_domain, dead_address(), TMAP, policy="none", safe_action="zero",
                         config={"release_tokens": path}) as node:
        estop = operator.publisher("/tether/estop", messages.BOOL)
        release = operator.publisher("/tether/estop_release", messages.STRING)
        states = []
        operator.subscribe("/tether/estop_state", messages.BOOL, lambda m: states.append(m.data), reliable=True)
        wait_until(lambda: estop.subscriber_count() and release.subscriber_count(), timeout=10, what="the node")
        estop(messages.bool_msg(True))
        wait_until(lambda: node.guard.estopped, timeout=5, what="the latch")
        estop(messages.bool_msg(False))
        release(messages.string_msg(""))
        release(messages.string_msg("ada"))                  # the old, unauthenticated form
        release(messages.string_msg("ada: cell clear"))
        wait_until(lambda: states.count(True) >= 5, timeout=5, what="the node answering each message")
        assert node.guard.estopped and False not in states[states.index(True):]
        assert node.stats.errors["RELEASE_REFUSED"] == 3


def test_an_operator_estop_survives_a_restart_of_the_node(ros_domain, tokens, tmp_path):
    """The latch file: a node stopped while an operator's e-stop holds starts again latched, sending
    the safe action, until a release with a credential."""
    path, token_file = tokens
    latch = tmp_path / "state" / "latch.json"
    config = {"release_tokens": path, "latch_file": latch}
    with running_edge(ros_domain, dead_address(), TMAP, policy="none", safe_action="zero", config=config) as node:
        cli("estop", "--operator", "ada", domain=ros_domain)
        assert node.guard.estopped
    with running_edge(ros_domain, dead_address(), TMAP, policy="none", safe_action="zero", config=config) as node:
        assert node.guard.estopped and node.guard.estop_reason.startswith("True on ")
        states = []
        with DdsTransport(domain_id=ros_domain, node_name="operator") as operator:
            operator.subscribe("/tether/estop_state", messages.BOOL, lambda m: states.append(m.data), reliable=True)
            wait_until(lambda: True in states, timeout=10, what="the restarted node reporting its latch")
        cli("release", "--operator", "ada", "--token-file", str(token_file), "--node", NODE, domain=ros_domain)
        assert not node.guard.estopped
    with running_edge(ros_domain, dead_address(), TMAP, policy="none", safe_action="zero", config=config) as node:
        assert not node.guard.estopped      # released before the (clean) stop: starts released


def test_cli_errors_name_the_problem(ros_domain, tokens, capsys, monkeypatch):
    _, token_file = tokens
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(CommandError, match="no edge node confirmed a release of 'tether_edge' by 'ada'"):
        cli("release", "--operator", "ada", "--token-file", str(token_file), "--timeout", "0.3", domain=ros_domain)
    with pytest.raises(SystemExit) as exc:
        main(["release", "--operator", "  ", "--domain-id", str(ros_domain)])
    assert exc.value.code == 2 and "--operator: expected a non-empty name without ':'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["release", "--operator", "ada", "--domain-id", str(ros_domain)])
    assert exc.value.code == 2 and f"--token, --token-file or ${TOKEN_ENV}" in capsys.readouterr().err
    with pytest.raises(CommandError, match="token: this token is for 'ada', not 'bob'"):
        cli("release", "--operator", "bob", "--token-file", str(token_file), domain=ros_domain)
    with pytest.raises(SystemExit) as exc:
        main(["--gateway", "127.0.0.1:1", "--rate", "0", "--domain-id", str(ros_domain)])
    assert exc.value.code == 2 and "rate_hz: expected a number of Hz in (0, 2000], got 0.0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--gateway", "127.0.0.1:1", "--safe-action", "9", "--domain-id", str(ros_domain)])
    assert exc.value.code == 2 and "safe_action" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--gateway", "no-port", "--domain-id", str(ros_domain)])
    assert exc.value.code == 2 and "gateway: expected HOST:PORT, got 'no-port'" in capsys.readouterr().err
