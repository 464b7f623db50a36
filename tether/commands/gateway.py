"""`tether gateway`: serve tether.v1 in front of Triton (bridge.gateway.cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "serve tether.v1 in front of Triton"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "gateway", HELP)


def run(args: argparse.Namespace) -> int:
    from bridge.app import main

    return exit_code(main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether gateway` by prog (the CLI reference and tests/test_cli.py read them)."""
    from bridge.gateway.cli import parser

    return {'tether gateway': parser()}
