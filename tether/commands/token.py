"""`tether token`: operator / trainer tokens, stored hashed (bridge.security.cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "operator / trainer tokens, stored hashed"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "token", HELP)


def run(args: argparse.Namespace) -> int:
    from bridge.security.cli import token_main

    return exit_code(token_main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether token` by prog (the CLI reference and tests/test_cli.py read them)."""
    from bridge.security.cli import token_parser

    return {'tether token': token_parser()}
