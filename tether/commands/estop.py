"""`tether estop`: latch an e-stop on sessions of a gateway (bridge.console.cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "latch an e-stop on sessions of a gateway"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "estop", HELP)


def run(args: argparse.Namespace) -> int:
    from bridge.console.cli import main

    return exit_code(main("estop", args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether estop` by prog (the CLI reference and tests/test_cli.py read them)."""
    from bridge.console.cli import _parser

    return {'tether estop': _parser('estop')}
