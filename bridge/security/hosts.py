"""Which hosts a served HTTP page answers to and may be bound on: the console's rules, kept below both the
gateway (which parses `--console-allowed-host`) and the console (which enforces them).

    allowed_host("Console.Example.com:8443")   # "console.example.com:8443": a Host header value to accept
    check_console_bind("0.0.0.0", auth)        # ExposedConsole unless auth has tokens or client certificates
"""

from __future__ import annotations

from bridge.security.tls import InsecureBind, is_loopback

__all__ = ["ExposedConsole", "allowed_host", "check_console_bind"]


class ExposedConsole(InsecureBind):
    """A console on a non-loopback address while the gateway has neither tokens nor client certificates."""


def check_console_bind(host: str, auth) -> None:
    """Open access only on loopback: elsewhere the console needs tokens or client certificates, whatever
    the gRPC bind. Raises ExposedConsole naming the way out.

    >>> from bridge.security import Authorizer
    >>> check_console_bind("127.0.0.1", Authorizer())       # loopback: open access is fine
    >>> check_console_bind("0.0.0.0", Authorizer())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bridge.security.hosts.ExposedConsole: refusing to serve the console on '0.0.0.0', which is not a loopback ...
    """
    if is_loopback(host):
        return
    if auth.open_access or (auth.tokens is None and not auth.client_certs):
        raise ExposedConsole(f"refusing to serve the console on {host!r}, which is not a loopback address, without "
                             f"credentials: give the gateway --tokens FILE (tether token add) or --tls-client-ca, "
                             f"or bind the console to 127.0.0.1 (--console-host)")


def allowed_host(entry: str) -> str:
    """An allowed Host value, normalised: "NAME", "NAME:PORT", "[V6]:PORT" (a bare IPv6 address gets brackets).

    >>> allowed_host("Console.Example.com"), allowed_host("10.0.0.5:8080"), allowed_host("fe80::1")
    ('console.example.com', '10.0.0.5:8080', '[fe80::1]')
    """
    value = entry.strip().lower()
    if value.count(":") > 1 and not value.startswith("["):
        value = f"[{value}]"
    name, _, port = value.rpartition(":") if not value.endswith("]") else (value, "", "")
    if not name:
        name, port = value, ""
    if not name or any(c in name for c in "/ @?#") or (port and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ValueError(f"console allowed host {entry!r} is not NAME or NAME:PORT")
    return name + (f":{port}" if port else "")
