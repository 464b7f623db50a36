"""`tether rollout`: see and steer policy versions (list|promote|rollback|pin|canary) (tether.rollout_cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "see and steer policy versions (list|promote|rollback|pin|canary)"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "rollout", HELP)


def run(args: argparse.Namespace) -> int:
    from tether.rollout_cli import main

    return exit_code(main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether rollout` by prog (the CLI reference and tests/test_cli.py read them)."""
    from tether.rollout_cli import parser

    return {'tether rollout': parser()}
