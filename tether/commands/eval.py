"""`tether eval`: a policy's verdict on simulators with fixed seeds (tether.evaluation.cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "evaluate a policy on simulators: figures, a baseline comparison and a pass/fail exit status"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "eval", HELP)


def run(args: argparse.Namespace) -> int:
    from tether.evaluation.cli import main

    return exit_code(main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether eval` by prog (the CLI reference and tests/test_cli.py read them)."""
    from tether.evaluation.cli import parser

    return {"tether eval": parser()}
