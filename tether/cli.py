"""`tether`: one command, one subcommand per process of the topology.

    tether demo --env Hopper-v5 --envs 8 --seconds 10 --summary out/summary.json
    tether demo --env newton:cartpole --envs 256 --sessions 2
    tether triton --model-repository runs/models --init Hopper-v5
    tether gateway --triton 127.0.0.1:8001 --policy hopper_v5 --console-port 8080   # console + /metrics
    tether status --gateway 127.0.0.1:50051            # sessions and versions; estop/release --robot NAME | --all
    tether sim --gateway 127.0.0.1:50051 --env Hopper-v5 --envs 8 --seconds 10
    tether sim --gateway 127.0.0.1:50051 --env newton:cartpole --envs 64 --sessions 2
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
import sys

from tether.commands import NAMES, load

COMMANDS = NAMES  # tether/commands/<name>.py, each with HELP, register(subparsers), run(args)


def _parser(names: tuple[str, ...]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether", description="Robot-in-the-loop middleware: one command per process.",
                                epilog="`tether COMMAND -h` for a command's flags; docs/cli.md lists them all.")
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(NAMES) + "}", required=True)
    for name in names:
        load(name).register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    """`tether COMMAND ...`: returns 0 when the command succeeded; a failure raises SystemExit with its
    non-zero status (1 failed, 2 bad usage, 130 interrupted), so a caller ignoring the result still fails."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in NAMES:
        print(__doc__, file=sys.stderr)
        if argv and argv[0] in ("-h", "--help"):
            _parser(NAMES).print_help()
            raise SystemExit(0)
        raise SystemExit(f"usage: tether {{{','.join(NAMES)}}} [options]")
    name = argv[0]
    command = load(name)
    args = _parser((name,)).parse_args(argv)
    try:
        code = command.run(args)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except ConnectionError as exc:  # a missing or failed peer process is a message, not a traceback
        raise SystemExit(f"tether {name}: {exc}") from None
    if code:
        raise SystemExit(code)
    return 0
