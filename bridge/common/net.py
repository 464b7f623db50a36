"""Which hosts are this machine: the one loopback rule for servers (binds) and clients (tokens in plaintext).

    >>> [is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "[::1]", "localhost", "0.0.0.0", "127.evil.example")]
    [True, True, True, True, False, False]
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 (bracketed or not) and "localhost"; False for anything else, wildcards and names."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
