"""`tether policy`: import or inspect a TorchScript / ONNX policy file (tether.policy_cli)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "import or inspect a TorchScript / ONNX policy file"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "policy", HELP)


def run(args: argparse.Namespace) -> int:
    from tether.policy_cli import main

    return exit_code(main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether policy` by prog (the CLI reference and tests/test_cli.py read them)."""
    from tether.policy_cli import parsers

    return parsers()
