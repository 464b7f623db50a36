"""`tether certs` and `tether token`: a lab CA with certificates, and hashed operator tokens.

    tether certs init runs/certs --host gw.lab --client arm_1:robot --client alice:operator
    tether certs client runs/certs arm_2 --role robot
    tether token add alice --role operator --file runs/tokens.json     # prints the token once
    tether token list --file runs/tokens.json
    tether token revoke alice --file runs/tokens.json

Then: `tether gateway ... --tls-cert runs/certs/server.crt --tls-key runs/certs/server.key
--tls-client-ca runs/certs/ca.crt --tokens runs/tokens.json`, and clients pass `--tls-ca
runs/certs/ca.crt --tls-cert runs/certs/arm_1.crt --tls-key runs/certs/arm_1.key` (and `--token`
or $TETHER_TOKEN for operator commands).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bridge.security.certs import CERT_ROLES, CertError, init_certs, issue_client
from bridge.security.tokens import ROLES, TokenError, TokenStore

DEFAULT_TOKENS = Path("runs/tokens.json")


def _client(item: str) -> tuple[str, str]:
    name, sep, role = item.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"--client takes NAME:ROLE (role one of {', '.join(CERT_ROLES)}), "
                                         f"got {item!r}")
    return name, role


def certs_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether certs", description="A local CA and certificates for a lab.")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("init", help="make a CA, a server certificate and client certificates in DIR")
    i.add_argument("dir", type=Path, help="where the CA, the server's and the clients' files go")
    i.add_argument("--host", action="append", default=[],
                   help="another name or IP the gateway is reached at (repeatable; 127.0.0.1, ::1, localhost always)")
    i.add_argument("--client", action="append", default=[], type=_client, metavar="NAME:ROLE",
                   help=f"a client certificate CN=NAME OU=ROLE, ROLE in {', '.join(CERT_ROLES)} (repeatable)")
    i.add_argument("--force", action="store_true", help="replace an existing CA (every old certificate stops working)")
    c = sub.add_parser("client", help="issue one more client certificate with the CA in DIR")
    c.add_argument("dir", type=Path, help="the directory of `tether certs init` (holds ca.key)")
    c.add_argument("name", help="the client's name (the certificate's CN, its identity)")
    c.add_argument("--role", required=True, choices=CERT_ROLES, help="what it may do (the certificate's OU)")
    return p


def certs_main(argv: list[str] | None = None) -> None:
    a = certs_parser().parse_args(argv)
    try:
        if a.command == "init":
            paths = init_certs(a.dir, hosts=a.host, clients=a.client, force=a.force)
        else:
            paths = issue_client(a.dir, a.name, role=a.role)
    except CertError as exc:
        raise SystemExit(f"tether certs: {exc}") from None
    for name, path in paths.items():
        print(f"{name:<20} {path}")
    if "ca.key" in paths:
        print(f"keep {paths['ca.key']} private: whoever holds it can issue any identity", file=sys.stderr)


def token_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether token", description="Operator/trainer tokens, stored hashed (scrypt).")
    sub = p.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="make a token for NAME and print it (once)")
    add.add_argument("name", help="who holds the token")
    add.add_argument("--role", required=True, choices=ROLES, help="what the token may do")
    add.add_argument("--replace", action="store_true", help="replace NAME's existing token")
    rev = sub.add_parser("revoke", help="delete NAME's token")
    rev.add_argument("name", help="whose token")
    lst = sub.add_parser("list", help="names, roles and dates (never secrets)")
    for q in (add, rev, lst):
        q.add_argument("--file", type=Path, default=DEFAULT_TOKENS, help=f"the tokens file (default {DEFAULT_TOKENS})")
    return p


def token_main(argv: list[str] | None = None) -> None:
    a = token_parser().parse_args(argv)
    try:
        store = TokenStore(a.file)
        if a.command == "add":
            token = store.add(a.name, role=a.role, replace=a.replace)
            print(token)
            print(f"token for {a.name} ({a.role}) stored hashed in {a.file}; it is not shown again. "
                  f"Clients: --token or $TETHER_TOKEN", file=sys.stderr)
        elif a.command == "revoke":
            store.revoke(a.name)
            print(f"revoked {a.name}", file=sys.stderr)
        else:
            for e in store.entries():
                created = time.strftime("%Y-%m-%d %H:%M", time.gmtime(e.created_unix))
                print(f"{e.name:<24} {e.role:<9} created {created} UTC")
    except TokenError as exc:
        raise SystemExit(f"tether token: {exc}") from None
