"""`tether certs`: a lab CA and certificates (bridge.security.cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "a lab CA and certificates"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "certs", HELP)


def run(args: argparse.Namespace) -> int:
    from bridge.security.cli import certs_main

    return exit_code(certs_main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether certs` by prog (the CLI reference and tests/test_cli.py read them)."""
    from bridge.security.cli import certs_parser

    return {'tether certs': certs_parser()}
