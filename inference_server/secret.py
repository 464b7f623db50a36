"""The shared secret that Triton's restricted protocols check (`TritonServer(secret=...)`, the gateway's
`--triton-secret-file`): only whoever holds it may use any Triton endpoint, health included.

Triton names the header after the restriction key; over gRPC it prefixes the key with
`triton-grpc-protocol-`, over HTTP it takes the key as it is:

    secret = read_secret("lab/triton.secret")     # 16-256 url-safe characters; the file's bytes stripped
    grpc_headers(secret)   # {"triton-grpc-protocol-tether-triton-key": secret}: tritonclient.grpc `headers=`
    http_headers(secret)   # {"tether-triton-key": secret}: HTTP (urllib, tritonclient.http)

    >>> new_secret().isascii() and len(new_secret()) == 43
    True
    >>> check_secret("short", where="file 'x'")
    Traceback (most recent call last):
    ...
    ValueError: the Triton secret in file 'x' must be 16-256 characters of A-Z a-z 0-9 - _ (got 5 characters)
    >>> redact("token abc in a line", "abc")
    'token *** in a line'
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path

from bridge.common.files import read_ascii

__all__ = ["CATEGORIES", "KEY", "check_secret", "grpc_headers", "http_headers", "new_secret", "read_secret",
           "redact"]

KEY = "tether-triton-key"                # the restriction key; the HTTP header
GRPC_HEADER = "triton-grpc-protocol-" + KEY  # the gRPC metadata key Triton 2.51 checks for it
# every protocol group of Triton 2.51's --grpc-restricted-protocol / --http-restricted-api
CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
              "statistics", "trace", "logging")
_SECRET = re.compile(r"[A-Za-z0-9_-]{16,256}")  # no ':' ',' '=' (Triton's flag syntax) nor spaces


def new_secret() -> str:
    """A fresh secret: 32 random bytes, url-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def check_secret(secret: str, *, where: str = "the argument") -> str:
    """`secret` if it is 16-256 url-safe characters; else a ValueError naming `where`, never the value."""
    if not isinstance(secret, str) or not _SECRET.fullmatch(secret):
        size = f"{len(secret)} characters" if isinstance(secret, str) else type(secret).__name__
        raise ValueError(f"the Triton secret in {where} must be 16-256 characters of A-Z a-z 0-9 - _ (got {size})")
    return secret


def read_secret(path: Path | str) -> str:
    """The secret kept in the file `path` (surrounding whitespace stripped); ValueError naming the file."""
    return check_secret(read_ascii(path, what="Triton secret"), where=f"file {str(path)!r}")


def grpc_headers(secret: str | None) -> dict[str, str] | None:
    """tritonclient.grpc's `headers=` for `secret` (None without one)."""
    return {GRPC_HEADER: secret} if secret else None


def http_headers(secret: str | None) -> dict[str, str]:
    """The HTTP request headers for `secret` (empty without one)."""
    return {KEY: secret} if secret else {}


def redact(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` replaced by `***` (Triton's log, error messages)."""
    return text.replace(secret, "***") if secret else text
