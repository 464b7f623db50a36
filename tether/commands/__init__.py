"""One module per `tether` command, each the same shape:

    HELP = "one line for `tether --help`"
    def register(subparsers) -> argparse.ArgumentParser   # adds `tether NAME` and its flags
    def run(args: argparse.Namespace) -> int               # the exit status is the outcome

`tether/cli.py` imports only the command it runs (a module here imports its owner lazily inside
`register`/`run`, so `tether status` never loads torch). Shared flag groups: `bridge.common.flags`.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

NAMES = ("demo", "triton", "gateway", "sim", "edge", "train", "rollout", "policy", "status", "estop", "release",
         "certs", "token", "log", "eval", "archive", "cluster")


def load(name: str) -> ModuleType:
    """The module of command `name` (one of NAMES)."""
    if name not in NAMES:
        raise KeyError(name)
    return importlib.import_module(f"tether.commands.{name}")


def passthrough(subparsers, name: str, help: str):
    """`tether NAME ARGS...`: the command's own parser (its owner's `parser()`) reads ARGS, so flags and
    `-h` reach it verbatim and only the chosen command's modules are imported."""
    p = subparsers.add_parser(name, help=help, add_help=False, prefix_chars="\0")
    p.add_argument("argv", nargs="*", help=argparse.SUPPRESS)
    return p


def exit_code(result: object) -> int:
    """A command's `main` result as an exit status: None (returned normally) is 0."""
    return 0 if result is None else int(result)
