"""`tether edge`: the ROS 2 edge node (and edge estop|release|token) (bridge.ros2.edge)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "the ROS 2 edge node (and edge estop|release|token)"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "edge", HELP)


def run(args: argparse.Namespace) -> int:
    from bridge.ros2.edge import main

    return exit_code(main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether edge` by prog (the CLI reference and tests/test_cli.py read them)."""
    from bridge.ros2.edge import parsers

    return parsers()
