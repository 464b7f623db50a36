"""`tether status`: sessions, versions and e-stops of a gateway (bridge.console.cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "sessions, versions and e-stops of a gateway"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "status", HELP)


def run(args: argparse.Namespace) -> int:
    from bridge.console.cli import main

    return exit_code(main("status", args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether status` by prog (the CLI reference and tests/test_cli.py read them)."""
    from bridge.console.cli import _parser

    return {'tether status': _parser('status')}
