"""`tether`: one command, one subcommand per process of the topology.

    tether demo --env Hopper-v5 --envs 8 --seconds 10 --summary out/summary.json
    tether demo --env newton:cartpole --envs 256 --sessions 2
    tether triton --model-repository runs/models --init Hopper-v5
    tether gateway --triton 127.0.0.1:8001 --policy hopper_v5 --console-port 8080   # console + /metrics
    tether status --gateway 127.0.0.1:50051            # sessions and versions; estop/release --robot NAME | --all
    tether sim --gateway 127.0.0.1:50051 --env Hopper-v5 --envs 8 --seconds 10
    tether sim --gateway 127.0.0.1:50051 --env newton:cartpole --envs 64 --sessions 2
    tether view --gateway 127.0.0.1:50051 --port 8765   # live in Foxglove: ws://127.0.0.1:8765
    tether edge --gateway 127.0.0.1:50051 --topic-map launch/config/topic_map.yaml --transport dds
    tether train --gateway 127.0.0.1:50051 --algo ppo --policy invertedpendulum_v5 --nproc 2
    tether log inspect runs/demo/experience
    tether certs init runs/certs --client arm_1:robot --client alice:operator
    tether token add alice --role operator --file runs/tokens.json
    tether policy import walker.onnx --policy walker --gateway 127.0.0.1:50051
    tether cluster up --gateways 2 --tritons 2 --trainer-nodes 2   # PostgreSQL, NATS, replicas, gateways, trainer
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass

__all__ = ["COMMANDS", "Command", "main"]


@dataclass(frozen=True)
class Command:
    """One `tether NAME`: its help line, and its `main(argv)` and parsers as "module:function", imported only
    when used (`tether --help` imports none). `args` go before argv/in the parsers' call (one `main` serving
    several commands). The parsers function gives one parser or {prog: parser} with its subcommands'."""

    help: str
    main: str
    parsers: str
    args: tuple[str, ...] = ()

    def run(self, argv: list[str]) -> int:
        """`main(*args, argv)` as an exit status: None (returned normally) is 0."""
        result = _function(self.main)(*self.args, argv)
        return 0 if result is None else int(result)

    def parser_by_prog(self) -> dict[str, argparse.ArgumentParser]:
        """Every parser of the command by prog (the CLI reference and tests/test_cli.py read them)."""
        made = _function(self.parsers)(*self.args)
        return made if isinstance(made, dict) else {made.prog: made}


def _function(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


COMMANDS: dict[str, Command] = {
    "demo": Command("Triton + gateway + sims (+ trainer), closed loop, one process tree",
                    "tether.demo_cli:main", "tether.demo_cli:parser"),
    "triton": Command("run tritonserver on a model repository",
                      "tether.demo_cli:triton_main", "tether.demo_cli:triton_parser"),
    "gateway": Command("serve tether.v1 in front of Triton", "bridge.app:main", "bridge.gateway.cli:parser"),
    "sim": Command("connect simulated envs to a gateway", "sim.cli:main", "sim.cli:parser"),
    "edge": Command("the ROS 2 edge node (and edge estop|release|token)",
                    "bridge.ros2.edge:main", "bridge.ros2.edge:parsers"),
    "train": Command("distributed PPO / BC training under torchrun, off-policy SAC on one rank",
                     "trainer.main:main", "trainer.main:parsers"),
    "rollout": Command("see and steer policy versions (list|promote|rollback|pin|canary)",
                       "tether.rollout_cli:main", "tether.rollout_cli:parser"),
    "policy": Command("import or inspect a TorchScript / ONNX policy file",
                      "tether.policy_cli:main", "tether.policy_cli:parsers"),
    "status": Command("sessions, versions and e-stops of a gateway",
                      "bridge.console.cli:main", "bridge.console.cli:_parser", ("status",)),
    "estop": Command("latch an e-stop on sessions of a gateway",
                     "bridge.console.cli:main", "bridge.console.cli:_parser", ("estop",)),
    "release": Command("release an operator's e-stop",
                       "bridge.console.cli:main", "bridge.console.cli:_parser", ("release",)),
    "view": Command("a gateway's robots live in Foxglove (Foxglove WebSocket: cameras, state, actions, hops, e-stops)",
                    "bridge.view.cli:main", "bridge.view.cli:parser"),
    "certs": Command("a lab CA and certificates", "bridge.security.cli:certs_main", "bridge.security.cli:certs_parser"),
    "token": Command("operator / trainer tokens, stored hashed",
                     "bridge.security.cli:token_main", "bridge.security.cli:token_parser"),
    "log": Command("inspect or export an experience log",
                   "bridge.experience.tool:main", "bridge.experience.tool:parser"),
    "eval": Command("evaluate a policy on simulators: figures, a baseline comparison and a pass/fail exit status",
                    "tether.evaluation.cli:main", "tether.evaluation.cli:parser"),
    "archive": Command("write the JetStream experience stream into MCAP segments",
                       "bridge.experience.archive:main", "bridge.experience.archive:parser"),
    "cluster": Command("a local fleet: PostgreSQL, NATS, Triton replicas, gateways, trainer nodes",
                       "tether.cluster.cli:main", "tether.cluster.cli:parser"),
}


def _overview() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether", description="Robot-in-the-loop middleware: one command per process.",
                                epilog="`tether COMMAND -h` for a command's flags; docs/cli.md lists them all.")
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", required=True)
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    """`tether COMMAND ...`: returns 0 when the command succeeded; a failure raises SystemExit with its
    non-zero status (1 failed, with `tether COMMAND: why` on stderr; 2 bad usage; 130 interrupted), so a
    caller ignoring the result still fails."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        if argv and argv[0] in ("-h", "--help"):
            _overview().print_help()
            raise SystemExit(0)
        print(f"usage: tether {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)
        raise SystemExit(2)
    name = argv[0]
    from bridge.common.errors import CommandError  # grpc: only once a command runs, never for `tether --help`

    try:
        code = COMMANDS[name].run(argv[1:])
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except CommandError as exc:
        raise SystemExit(f"{exc.prog or f'tether {name}'}: {exc}") from None
    except ConnectionError as exc:  # a missing or failed peer process is a message, not a traceback
        raise SystemExit(f"tether {name}: {exc}") from None
    if code:
        raise SystemExit(code)
    return 0
