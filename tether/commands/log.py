"""`tether log`: inspect or export an experience log (bridge.experience.tool)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "inspect or export an experience log"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "log", HELP)


def run(args: argparse.Namespace) -> int:
    from bridge.experience.tool import main

    return exit_code(main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether log` by prog (the CLI reference and tests/test_cli.py read them)."""
    from bridge.experience.tool import parser

    return {'tether log': parser()}
