"""`tether demo`: Triton + gateway + sims (+ trainer), closed loop, one process tree (tether.demo_cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "Triton + gateway + sims (+ trainer), closed loop, one process tree"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "demo", HELP)


def run(args: argparse.Namespace) -> int:
    from tether.demo_cli import main

    return exit_code(main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether demo` by prog (the CLI reference and tests/test_cli.py read them)."""
    from tether.demo_cli import parser

    return {'tether demo': parser()}
