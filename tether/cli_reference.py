"""The CLI reference, generated from the parsers themselves (so it cannot drift from them).

    python -m tether.cli_reference > docs/cli.md

tests/test_cli.py fails when docs/cli.md differs from what this prints.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

from bridge.common.flags import CONCEPTS, deprecated_aliases
from tether.cli import COMMANDS

__all__ = ["all_parsers", "reference"]

ROOT = Path(__file__).resolve().parent.parent


def all_parsers() -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(command, prog, parser) for every command's parsers and their subcommands, depth first."""
    for name, command in COMMANDS.items():
        for parser in command.parser_by_prog().values():
            yield from _walk(name, parser)


def _walk(name: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    yield name, parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                yield from _walk(name, sub)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for a in parser._actions:
        if a.help == argparse.SUPPRESS or isinstance(a, argparse._SubParsersAction):
            continue
        if a.option_strings:
            names = ", ".join(f"`{s}`" for s in a.option_strings)
            if a.nargs != 0:
                names += f" `{a.metavar or a.dest.upper()}`" if not isinstance(a.metavar, tuple) else ""
        else:
            names = f"`{a.metavar or a.dest}`"
        default = a.default
        if a.option_strings and "--token" in a.option_strings:
            default = None  # from $TETHER_TOKEN at parse time: never print a secret
        if isinstance(default, str | os.PathLike) and str(default).startswith(f"{ROOT}{os.sep}"):
            default = os.path.relpath(default, ROOT)  # a file of the checkout: the same on every machine
        shown = "" if default in (None, "", False, [], argparse.SUPPRESS) or a.nargs == 0 else f"`{default}`"
        choices = f" (one of: {', '.join(map(str, a.choices))})" if a.choices else ""
        rows.append(f"| {names} | {_cell(a.help or '')}{_cell(choices)} | {_cell(shown)} |")
    return rows


# defaults some parsers read from the environment, pinned so the reference is the same on every machine
_ENV = {"LOGNAME": "$USER", "TETHER_OPERATOR": "", "TETHER_TOKEN": "", "ROS_DOMAIN_ID": "0"}


_EXIT = [
    "## Exit status and errors", "",
    "One convention for every command (`tether/cli.py` holds the table of commands):", "",
    "| status | when | on stderr |", "|---|---|---|",
    "| 0 | done | - |",
    "| 1 | the command failed while running: a peer refused or is unreachable, a file does not load (the code "
    "raises `bridge.common.errors.CommandError`) | `tether COMMAND: why` |",
    "| 2 | bad usage: a flag that is malformed, out of range or contradicts another (`parser.error`) | the usage "
    "line, then `tether COMMAND: error: why` |",
    "| 130 | interrupted (Ctrl-C) | - |", "",
    "`tether eval` keeps its own CI contract: 1 means a check failed, 2 a usage or setup error (a policy that does "
    "not load, a gateway that cannot be reached). `tether train` exits with torchrun's status when a rank fails.",
]


def reference() -> str:
    saved = {k: os.environ.get(k) for k in _ENV}
    os.environ.update(_ENV)
    try:
        return _reference()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _reference() -> str:
    out = ["# `tether` command-line reference", "",
           "Generated from the parsers by `python -m tether.cli_reference > docs/cli.md`; do not edit by hand "
           "(tests/test_cli.py checks it is current).", "",
           "Commands: " + ", ".join(f"[`{n}`](#tether-{n})" for n in COMMANDS) + ".", "",
           *_EXIT, "",
           "## One spelling per concept", "",
           "Old spellings still work for one release and print a warning naming the new one.", "",
           "| concept | flag | replaces |", "|---|---|---|"]
    out += [f"| {c} | `{new}` | {', '.join(f'`{o}`' for o in old) or '-'} |" for c, (new, old) in CONCEPTS.items()]
    current = None
    for name, prog, parser in all_parsers():
        if name != current:
            current = name
            help_ = COMMANDS[name].help
            out += ["", f"## tether {name}", "", help_[:1].upper() + help_[1:] + "."]
        out += ["", f"### `{prog}`", ""]
        if parser.description:
            out += [parser.description, ""]
        out += ["| flag | meaning | default |", "|---|---|---|", *_flag_rows(parser)]
        if aliases := deprecated_aliases(parser):
            out += ["", "Deprecated: " + ", ".join(f"`{o}` (use `{n}`)" for o, n in sorted(aliases.items())) + "."]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
