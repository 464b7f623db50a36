"""`tether triton`: run tritonserver on a model repository (tether.demo_cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "run tritonserver on a model repository"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "triton", HELP)


def run(args: argparse.Namespace) -> int:
    from tether.demo_cli import triton_main

    return exit_code(triton_main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether triton` by prog (the CLI reference and tests/test_cli.py read them)."""
    from tether.demo_cli import triton_parser

    return {'tether triton': triton_parser()}
