"""`tether release`: release an operator's e-stop (bridge.console.cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "release an operator's e-stop"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "release", HELP)


def run(args: argparse.Namespace) -> int:
    from bridge.console.cli import main

    return exit_code(main("release", args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether release` by prog (the CLI reference and tests/test_cli.py read them)."""
    from bridge.console.cli import _parser

    return {'tether release': _parser('release')}
