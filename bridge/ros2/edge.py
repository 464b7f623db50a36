"""`tether edge`: the ROS 2 edge node as a command, and the operator's e-stop and release.

    tether edge --gateway 127.0.0.1:50051 --topic-map launch/config/topic_map.yaml --transport dds \\
                --rate 100 --domain-id 0 --policy arm --node-name tether_edge --deadline-ms 50 \\
                --release-tokens /etc/tether/release_tokens.json [--latch-file PATH --session-id ID] \
                [--chunk 20 --chunk-threshold 10 --chunk-merge ensemble]
    tether edge estop --operator ada --reason "person in the cell" --domain-id 0
    tether edge release --operator ada --token-file ada.token --node tether_edge --reason "cell clear" --domain-id 0
    tether edge token add ada --tokens release_tokens.json    # the node's --release-tokens; prints ada's token once

The flags mirror the launch arguments (`launch/robot.launch.py`, a test checks every flag has one;
an empty value means "not given"). ROS 2 finds the node as `<prefix>/lib/tether/edge`
(`launch/edge`): `ros2 run tether edge --gateway ...` is this command, and ROS arguments
(`--ros-args -r __node:=NAME`) are left to rclpy. The node prints a status line every `--status-s` seconds
and stops cleanly on Ctrl-C or SIGTERM: it ends the episode, publishes the safe action and
leaves the e-stop latched. `estop` and `release` return once an edge node on the domain reports
the requested latch state (see `bridge.ros2.estop`), and exit 1 if none does in `--timeout`.
The node itself is `bridge.ros2.node.EdgeNode` (re-exported here); its module documents the
threading model: the transport's receive thread only stores messages and latches the guard, the
link thread owns the gRPC stream, and one control thread owns the guard and the publishers, so
the watchdog never waits on the network.

Guard settings are parsed here; a bad one names itself:

    >>> parse_vector("--safe-action", "0, 0.5,-1"), parse_vector("--safe-action", "hold")
    ((0.0, 0.5, -1.0), 'hold')
    >>> parse_vector("--max-delta", "fast")
    Traceback (most recent call last):
    ...
    ValueError: --max-delta: expected a number or comma-separated numbers, got 'fast'
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from bridge.client.chunks import chunk_flags
from bridge.common.errors import CommandError
from bridge.common.files import write_json
from bridge.common.flags import credential_flags, deprecated_alias, optional_path
from bridge.ros2 import release_auth
from bridge.ros2.edge_config import EdgeConfig, EdgeConfigError, default_latch_file, guard_config
from bridge.ros2.edge_stats import EdgeStats
from bridge.ros2.estop import ESTOP_TOPIC, RELEASE_TOPIC, STATE_TOPIC, EstopError, request_estop, request_release
from bridge.ros2.node import EdgeError, EdgeNode
from bridge.ros2.release_auth import DEFAULT_NODE, TOKEN_ENV, read_token
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, TopicMapError, load_topic_map
from bridge.ros2.transport import TransportError
from bridge.ros2.transports import open_transport

__all__ = ["EdgeConfig", "EdgeNode", "EdgeStats", "guard_config", "main", "parse_vector"]


def parse_vector(flag: str, text: str) -> str | float | tuple[float, ...]:
    """`hold`/`zero` as they are, one number as a float, `a,b,c` as a tuple of floats."""
    if text in ("hold", "zero"):
        return text
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{flag}: expected a number or comma-separated numbers, got {text!r}") from None
    return values[0] if len(values) == 1 else values


def _domain_default() -> int:
    value = os.environ.get("ROS_DOMAIN_ID", "0")
    return int(value) if value.isdigit() else 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic-map", type=Path, default=DEFAULT_TOPIC_MAP, help="topic map YAML")
    p.add_argument("--transport", choices=("auto", "rclpy", "dds"), default="auto",
                   help="rclpy, or DDS directly (no ROS install); auto: rclpy when it imports")
    p.add_argument("--domain-id", type=int, default=_domain_default(), help="ROS 2 domain (default $ROS_DOMAIN_ID)")


def split_ros_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """The node's own flags and the ROS arguments (`--ros-args ... [--]`, as `ros2 run` and
    launch_ros's `Node` append them: rclpy reads those from `sys.argv` itself).

        >>> split_ros_args(["--gateway", "h:1", "--ros-args", "-r", "__node:=arm", "--", "--rate", "50"])
        (['--gateway', 'h:1', '--rate', '50'], ['--ros-args', '-r', '__node:=arm', '--'])
    """
    node: list[str] = []
    ros: list[str] = []
    inside = False
    for arg in argv:
        if arg == "--ros-args":
            inside = True
        if inside:
            ros.append(arg)
            inside = arg != "--"
        else:
            node.append(arg)
    return node, ros


def _node_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether edge", description="ROS 2 edge node: robot topics <-> gateway, "
                                "through the local safety guard. Subcommands: estop, release, token.")
    p.add_argument("--gateway", required=True, action="append", help="gateway address HOST:PORT; several "
                   "(A,B or the flag repeated): the node fails over along the list, replaying what the log lacks")
    _common(p)
    p.add_argument("--rate", type=float, default=100.0, help="control rate in Hz")
    p.add_argument("--policy", default="", help="policy (Triton model) name; default: the gateway's")
    p.add_argument("--node-name", default="tether_edge", help="the ROS 2 node's name")
    p.add_argument("--watchdog-ms", type=float, default=50.0, help="watchdog: no fresh action this long -> safe action")
    deprecated_alias(p, "--deadline-ms", "--watchdog-ms")  # the gateway's --deadline-ms is the inference deadline
    p.add_argument("--safe-action", default="hold", help="hold | zero | comma-separated values")
    p.add_argument("--max-delta", help="largest command change per step (one value or one per joint)")
    p.add_argument("--velocity-limit", help="largest command change per second (one value or one per joint); "
                   "default: the topic map's velocity_limit, else 0.5")
    p.add_argument("--operators", help=argparse.SUPPRESS)   # replaced by --release-tokens: refused, saying so
    chunk_flags(p)
    p.add_argument("--status-every", type=float, default=5.0, metavar="SECONDS", help="seconds between status lines")
    deprecated_alias(p, "--status-s", "--status-every")
    credential_flags(p, token_help="robot token NAME.SECRET")
    p.add_argument("--summary", type=optional_path, metavar="PATH", help="on stop, write the node's counts and every "
                   "command with what produced it (policy version, chunk, index) to this JSON file")
    deprecated_alias(p, "--report", "--summary")
    p.add_argument("--session-id", default="", help="the gateway session id, stable across restarts (default "
                   "NODE_NAME@HOSTNAME); the node continues its steps where the gateway's log is")
    p.add_argument("--latch-file", type=optional_path, help="the e-stop latch, kept across restarts "
                   "(fsynced): a node that stopped e-stopped starts e-stopped (default "
                   "$XDG_STATE_HOME/tether/NODE_NAME.json, ~/.local/state without it)")
    p.add_argument("--release-tokens", type=optional_path, help="the node's release tokens file (`tether edge "
                   "token add NAME --tokens FILE`); without it every local release is refused")
    return p


def write_report(node: EdgeNode, path: Path) -> None:
    """The node's counts and command log as JSON, written to a temporary name and renamed."""
    s, g = node.stats, node.guard.counts
    errors = getattr(node.transport, "delivery_errors", None)
    report = {
        "stats": {"observations": s.observations, "actions": s.actions, "commands": s.commands,
                  "safe_commands": s.safe_commands, "ticks": s.ticks, "starved": s.starved, "overruns": s.overruns,
                  "connects": s.connects, "errors": dict(s.errors), "skipped": dict(s.skipped),
                  "rtt_ms": s.rtt_ms(), "gateway_ms": s.gateway_ms(), "inference_ms": s.inference_ms(),
                  "policy_version": s.policy_version, "person_commands": s.person_commands,
                  "overridden": s.overridden, "interventions": s.interventions,
                  "undelivered": {} if errors is None else errors.counts},
        "link": node.link_counts(),
        "guard": {"clamped": g.clamped, "rate_limited": g.rate_limited, "watchdog": g.watchdog, "estop": g.estop,
                  "estopped": g.estopped, "estop_reason": node.guard.estop_reason, "gateway_estop": g.gateway_estop,
                  "velocity_limit": list(node.guard.config.velocity_limit or ())},
        "commands": [{"t": r.t, "tick": r.tick, "sent": r.sent.tolist(), "limited": r.limited,
                      **({"chunk": r.source.chunk, "index": r.source.index, "policy_version": r.source.policy_version,
                          "ensembled": r.source.ensembled, "blend": r.source.blend} if r.source else
                         {"person": True} if r.person else {"safe": True})}
                     for r in list(node.command_log)],
    }
    write_json(path, report, indent=None)  # bridge.common.files: atomic and durable


def main(argv: list[str] | None = None) -> None:
    """`tether edge ...`: bad flags exit 2 (`parser.error`); a transport or node failure raises `CommandError`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("estop", "release"):
        _operator(argv[0], argv[1:])
        return
    if argv and argv[0] in ("token", "tokens"):       # the node's release tokens (bridge.ros2.release_auth)
        release_auth.main(argv[1:])
        return
    parser = _node_parser()
    a = parser.parse_args(split_ros_args(argv)[0])
    a.token = a.token or os.environ.get("TETHER_TOKEN") or None
    try:
        tmap = load_topic_map(a.topic_map)
        guard = guard_config(
            tmap, deadline_s=a.watchdog_ms / 1e3, safe_action=parse_vector("--safe-action", a.safe_action),
            max_delta=parse_vector("--max-delta", a.max_delta) if a.max_delta else None,
            velocity_limit=parse_vector("--velocity-limit", a.velocity_limit) if a.velocity_limit else None)
        config = EdgeConfig(gateway=",".join(a.gateway), rate_hz=a.rate, policy=a.policy, node_name=a.node_name,
                            chunk=a.chunk, chunk_threshold=a.chunk_threshold, chunk_merge=a.chunk_merge,
                            ensemble_decay=a.ensemble_decay, chunk_prefix=a.chunk_prefix,
                            chunk_blend=a.chunk_blend, tls_ca=a.tls_ca, tls_cert=a.tls_cert,
                            tls_key=a.tls_key, token=a.token, session_id=a.session_id,
                            latch_file=a.latch_file or default_latch_file(a.node_name),
                            release_tokens=a.release_tokens)
        if not a.status_every > 0:
            raise EdgeConfigError(f"--status-every: expected seconds > 0, got {a.status_every}")
        if a.operators is not None:
            raise EdgeConfigError("--operators: a name no longer releases the e-stop; releases need an operator's "
                                  "token: create them with `tether edge token add NAME --tokens FILE` and start the "
                                  "node with --release-tokens FILE")
    except (TopicMapError, ValueError) as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        transport = open_transport(a.transport, domain_id=a.domain_id, node_name=a.node_name)
    except TransportError as exc:
        raise CommandError(exc) from None
    try:
        node = EdgeNode(config=config, topic_map=tmap, transport=transport, guard=guard)
        node.start()
        try:
            print(f"edge node {a.node_name}: {type(transport).__name__} on domain {a.domain_id}, gateway "
                  f"{config.gateway}, {a.rate:g} Hz, watchdog {a.watchdog_ms:g} ms, safe action {a.safe_action}, "
                  f"velocity limit {list(guard.velocity_limit)}, chunk {a.chunk or 'off'}, session "
                  f"{config.session_id}, latch file {config.latch_file}"
                  f"{f' (E-STOPPED: {node.guard.estop_reason})' if node.guard.estopped else ''}, "
                  f"release tokens {config.release_tokens or 'none (local releases refused)'}", flush=True)
            next_status = time.monotonic() + a.status_every
            while not stop.wait(0.05) and node.running:
                if time.monotonic() >= next_status:
                    print(node.status_line(), flush=True)
                    next_status += a.status_every
        finally:   # a stop, the node's own end, or a print that failed (the launch reading stdout killed):
            try:   # the node stops in order (safe action, LAST) before the transport closes under it
                node.stop()
            finally:
                if a.summary is not None:
                    write_report(node, a.summary)
        print(f"{node.status_line()}  stopped", flush=True)
    except (EdgeError, TransportError) as exc:
        raise CommandError(exc) from None
    finally:
        transport.close()


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether edge` by prog (the CLI reference and tests/test_cli.py read them)."""
    return {"tether edge": _node_parser(), "tether edge estop": _operator_parser("estop"),
            "tether edge release": _operator_parser("release"), "tether edge token": release_auth.parser()}


def _operator_parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"tether edge {command}",
                                description="Latch the edge nodes' e-stop" if command == "estop" else
                                "Release the edge nodes' e-stop (an operator's explicit act)")
    p.add_argument("--operator", required=True, help="who does this (logged; the release carries it)")
    p.add_argument("--reason", default="", help="why (logged by the node with the release)")
    _common(p)
    p.add_argument("--release-topic", default=RELEASE_TOPIC, help="the release topic the nodes listen on")
    p.add_argument("--state-topic", default=STATE_TOPIC, help="the e-stop state topic the nodes publish")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an edge node to confirm")
    if command == "release":
        p.add_argument("--node", default=DEFAULT_NODE, help="the edge node to release (its --node-name)")
        p.add_argument("--token", help=f"the operator's release token (better: --token-file or ${TOKEN_ENV})")
        p.add_argument("--token-file", type=Path, help="a file holding the operator's release token")
    return p


def _operator(command: str, argv: list[str]) -> None:
    p = _operator_parser(command)
    a = p.parse_args(argv)
    if not a.operator.strip() or ":" in a.operator:
        p.error(f"--operator: expected a non-empty name without ':', got {a.operator!r}")
    token = None
    if command == "release":
        try:
            token = read_token(token=a.token, token_file=a.token_file)
        except ValueError as exc:
            p.error(str(exc))
    try:
        tmap = load_topic_map(a.topic_map)
    except TopicMapError as exc:
        p.error(str(exc))
    try:
        transport = open_transport(a.transport, domain_id=a.domain_id, node_name="tether_operator")
    except TransportError as exc:
        raise CommandError(exc, prog=p.prog) from None
    try:
        if command == "estop":
            entry = tmap.estop
            request_estop(transport, estop_topic=entry.topic if entry else ESTOP_TOPIC,
                          reliable=entry.reliable if entry else True, state_topic=a.state_topic, timeout_s=a.timeout)
        else:
            request_release(transport, operator=a.operator.strip(), token=token, node=a.node, reason=a.reason,
                            release_topic=a.release_topic, state_topic=a.state_topic, timeout_s=a.timeout)
    except (EstopError, ValueError) as exc:
        raise CommandError(exc, prog=p.prog) from None
    finally:
        transport.close()
    what = "latched" if command == "estop" else "released"
    print(f"e-stop {what} by {a.operator.strip()} on domain {a.domain_id}", flush=True)
