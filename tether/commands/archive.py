"""`tether archive`: the JetStream experience stream into MCAP segments (bridge.experience.archive)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "write the JetStream experience stream into MCAP segments"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "archive", HELP)


def run(args: argparse.Namespace) -> int:
    from bridge.experience.archive import main

    return exit_code(main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether archive` by prog (the CLI reference and tests/test_cli.py read them)."""
    from bridge.experience.archive import parser

    return {"tether archive": parser()}
