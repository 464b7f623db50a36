"""Command-line flags every `tether` command spells the same way, and old spellings that still work.

    p = argparse.ArgumentParser(prog="tether status")
    gateway_flags(p)                     # --gateway HOST:PORT, --tls-ca/--tls-cert/--tls-key, --token
    credential_flags(p)                  # the credentials alone (a command with its own --gateway)
    policy_flag(p)                       # --policy NAME
    output_flags(p, summary=True)        # --summary PATH (JSON), and/or --json (print JSON)
    p.add_argument("--reason", default="", help="why (audit log)")
    deprecated_alias(p, "--why", "--reason")   # accepted, with a warning on stderr naming --reason

`CONCEPTS` is the table of one spelling per concept (tests/test_cli.py checks every parser against it).
A deprecated alias shares its flag's dest, type and action; using it prints
`<prog>: warning: --why is deprecated, use --reason` and otherwise behaves the same. The credential
flags are declared here only; `bridge.client.Credentials.from_args(args)` reads them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

__all__ = ["CONCEPTS", "TOKEN_ENV", "credential_flags", "deprecated_alias", "deprecated_aliases", "gateway_flags",
           "optional_path", "output_flags", "policy_flag"]

TOKEN_ENV = "TETHER_TOKEN"

# concept -> the one spelling, and the spellings it replaced (accepted with a warning for one release)
CONCEPTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "gateway address": ("--gateway", ()),
    "inference deadline (gateway)": ("--deadline-ms", ()),
    "edge watchdog": ("--watchdog-ms", ("--deadline-ms",)),
    "why an operator acts": ("--reason", ("--why",)),
    "session labels": ("--label", ("--labels",)),
    "status line interval": ("--status-every", ("--status-s",)),
    "experience log directory": ("--experience-dir", ("--log-dir",)),
    "Triton model repository": ("--model-repository", ("--repository",)),
    "result JSON file": ("--summary", ("--report",)),
    "print JSON to stdout": ("--json", ()),
    "policy name": ("--policy", ("--name",)),
}


class _Deprecated(argparse.Action):
    """Warns that `option_string` is deprecated, then does what the new flag's action does."""

    def __init__(self, option_strings, dest, *, target: argparse.Action, new: str, **kwargs):
        super().__init__(option_strings, dest, nargs=target.nargs, type=target.type, metavar=target.metavar,
                         help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)
        self.target, self.new = target, new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: warning: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        self.target(parser, namespace, values, self.new)


def deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """Accept `old` for the already added flag `new` (same dest, type and action), warning on use."""
    target = next((a for a in parser._actions if new in a.option_strings), None)
    if target is None:
        raise ValueError(f"{parser.prog}: no flag {new} to alias {old} to")
    parser.add_argument(old, dest=target.dest, action=_Deprecated, target=target, new=new)
    if target.required:  # either spelling satisfies it: argparse's own check would refuse the old one
        target.required, target.default = False, None
        target.help = f"{target.help} (required)" if target.help else "(required)"
        parse_known_args = parser.parse_known_args

        def checked(args=None, namespace=None):
            ns, extras = parse_known_args(args, namespace)
            if getattr(ns, target.dest, None) is None:
                parser.error(f"the following arguments are required: {new}")
            return ns, extras

        parser.parse_known_args = checked


def deprecated_aliases(parser: argparse.ArgumentParser) -> dict[str, str]:
    """old -> new for every deprecated alias of `parser` (not its subparsers)."""
    return {s: a.new for a in parser._actions if isinstance(a, _Deprecated) for s in a.option_strings}


def gateway_flags(parser: argparse.ArgumentParser, *, required: bool = False, default: str = "127.0.0.1:50051",
                  token: bool = True, token_help: str = "token NAME.SECRET",
                  several: bool = False) -> argparse._ArgumentGroup:
    """--gateway HOST:PORT with TLS (--tls-ca, --tls-cert, --tls-key) and --token (default $TETHER_TOKEN).
    `several`: the command takes HOST:PORT,HOST:PORT,... to fail over across (the caller splits it)."""
    g = parser.add_argument_group("gateway address and credentials")
    what = ("the gateways' gRPC addresses, comma-separated (the first that answers; the next on failure)"
            if several else "the gateway's gRPC address")
    g.add_argument("--gateway", metavar="HOST:PORT" + (",..." if several else ""), required=required,
                   default=None if required else default,
                   help=what + ("" if required else f" (default {default})"))
    credential_flags(g, token=token, token_help=token_help)
    return g


def credential_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, token: bool = True,
                     token_help: str = "token NAME.SECRET") -> None:
    """--tls-ca, --tls-cert, --tls-key (paths; an empty one is not given, as a launch file leaves it) and --token
    (default $TETHER_TOKEN, which keeps it off the process list)."""
    parser.add_argument("--tls-ca", type=optional_path, help="CA certificate to verify the gateway with (turns TLS "
                        "on)")
    parser.add_argument("--tls-cert", type=optional_path, help="client certificate, for a gateway that requires one "
                        "(mTLS; with --tls-key)")
    parser.add_argument("--tls-key", type=optional_path, help="the client certificate's private key")
    if token:
        parser.add_argument("--token", default=os.environ.get(TOKEN_ENV) or None,
                            help=f"{token_help} for a gateway that checks tokens (default: ${TOKEN_ENV})")


def optional_path(text: str) -> Path | None:
    """A path flag where "" means "not given" (a launch argument left empty)."""
    return Path(text) if text.strip() else None


def policy_flag(parser: argparse.ArgumentParser, *, required: bool = False,
                help: str = "policy (Triton model) name; default: the gateway's") -> None:
    parser.add_argument("--policy", required=required, default=None if required else "", help=help)


def output_flags(parser: argparse.ArgumentParser, *, summary: bool = False, json: bool = False,
                 summary_help: str = "also write the summary as JSON here") -> None:
    """--summary PATH (a JSON file, written atomically) and/or --json (print JSON to stdout)."""
    if summary:
        parser.add_argument("--summary", type=Path, metavar="PATH", help=summary_help)
    if json:
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
