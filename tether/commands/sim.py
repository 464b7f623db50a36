"""`tether sim`: connect simulated envs to a gateway (sim.cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "connect simulated envs to a gateway"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "sim", HELP)


def run(args: argparse.Namespace) -> int:
    from sim.cli import main

    return exit_code(main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether sim` by prog (the CLI reference and tests/test_cli.py read them)."""
    from sim.cli import parser

    return {'tether sim': parser()}
