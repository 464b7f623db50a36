"""`tether train`: distributed PPO / BC training under torchrun, SAC on one rank (trainer.main)."""

from __future__ import annotations

import argparse

from tether.commands import exit_code, passthrough

HELP = "distributed PPO / BC training under torchrun, off-policy SAC on one rank"


def register(subparsers) -> argparse.ArgumentParser:
    return passthrough(subparsers, "train", HELP)


def run(args: argparse.Namespace) -> int:
    from trainer.main import main

    return exit_code(main(args.argv))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Every parser of `tether train` by prog (the CLI reference and tests/test_cli.py read them)."""
    from trainer.main import parsers

    return parsers()
