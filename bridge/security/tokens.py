"""Bearer tokens for people and programs, stored hashed (scrypt, a salt per token) in a JSON file.

    store = TokenStore(Path("runs/security/tokens.json"))
    token = store.add("alice", role="operator")      # shown once: "alice.<secret>"; only its hash is kept
    store.verify(token)                              # -> TokenEntry(name="alice", role="operator", ...)
    store.verify("alice.wrong")                      # -> None (constant-time compare)

A token is `NAME.SECRET`: the name picks the entry (names are not secret), the secret (32 random
bytes) is checked against its salted scrypt hash. The file is rewritten atomically (mode 0600,
file and folder fsynced) and re-read when it changes on disk, so `tether token add` / `revoke`
take effect in a running gateway. Edits take an exclusive lock on `.<file>.lock` beside it
(fcntl.flock): two `tether token add` at once both land.

Verification results, good and bad, are cached for `CACHE_TTL_S` (at most `CACHE_ENTRIES`, keyed
by an HMAC of the token under a per-process key, never the token itself), and concurrent checks
of one token share one scrypt: a flood of bad tokens costs one scrypt per distinct token. Any
change of the file empties the cache (a revoked token stops working at once).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from bridge.common.files import write_atomic

ROLES = ("viewer", "trainer", "operator", "robot")  # what a token may be issued for (robot: run sessions)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOKEN_CHARS = 256
_SCRYPT = {"n": 1 << 14, "r": 8, "p": 1}  # 16 MiB, tens of ms per check: verified tokens are cached
CACHE_TTL_S = 30.0       # how long a verification result (good or bad) is reused
CACHE_ENTRIES = 4096     # results kept at most (the oldest go first)


class TokenError(ValueError):
    """A bad token name, role or tokens file."""


@dataclass(frozen=True)
class TokenEntry:
    name: str
    role: str
    salt: bytes
    digest: bytes
    created_unix: float
    n: int = _SCRYPT["n"]
    r: int = _SCRYPT["r"]
    p: int = _SCRYPT["p"]

    def matches(self, secret: str) -> bool:
        digest = hashlib.scrypt(secret.encode(), salt=self.salt, n=self.n, r=self.r, p=self.p,
                                dklen=len(self.digest), maxmem=64 << 20)
        return hmac.compare_digest(digest, self.digest)

    def to_json(self) -> dict:
        return {"role": self.role, "salt": self.salt.hex(), "scrypt": self.digest.hex(),
                "n": self.n, "r": self.r, "p": self.p, "created_unix": self.created_unix}

    @classmethod
    def from_json(cls, name: str, d: dict) -> TokenEntry:
        try:
            return cls(name=name, role=str(d["role"]), salt=bytes.fromhex(d["salt"]),
                       digest=bytes.fromhex(d["scrypt"]), created_unix=float(d.get("created_unix", 0.0)),
                       n=int(d["n"]), r=int(d["r"]), p=int(d["p"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise TokenError(f"token {name!r}: malformed entry ({exc})") from exc


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise TokenError(f"token name must be 1-64 of A-Z a-z 0-9 _ -, got {name!r}")
    return name


def check_role(role: str) -> str:
    if role not in ROLES:
        raise TokenError(f"role must be one of {', '.join(ROLES)}; got {role!r}")
    return role


class TokenStore:
    """The tokens file: add, revoke, list, verify. Thread-safe; verification results (good and bad)
    are cached in memory (see the module docstring). `scrypt_calls` counts the hashes computed."""

    def __init__(self, path: Path, *, cache_ttl_s: float = CACHE_TTL_S, cache_entries: int = CACHE_ENTRIES):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._entries: dict[str, TokenEntry] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._cache_key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, tuple[float, TokenEntry | None]] = OrderedDict()
        self._pending: dict[bytes, threading.Event] = {}  # tokens being hashed now: later askers wait for it
        self._cache_ttl_s, self._cache_entries = cache_ttl_s, cache_entries
        self.scrypt_calls = 0
        self._reload()

    # -- reading ---------------------------------------------------------------------------------
    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size  # each write is a new file (os.replace): a new inode

    def _reload(self) -> None:
        stamp = self._file_stamp()
        if stamp == self._stamp and self._stamp is not None:
            return
        entries: dict[str, TokenEntry] = {}
        if stamp is not None:
            try:
                doc = json.loads(self.path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise TokenError(f"cannot read the tokens file {self.path}: {exc}") from exc
            if not isinstance(doc, dict) or not isinstance(doc.get("tokens"), dict):
                raise TokenError(f"{self.path} is not a tokens file (no 'tokens' object)")
            entries = {name: TokenEntry.from_json(check_name(name), d) for name, d in doc["tokens"].items()}
        self._entries, self._stamp = entries, stamp
        self._cache.clear()

    def entries(self) -> list[TokenEntry]:
        with self._lock:
            self._reload()
            return sorted(self._entries.values(), key=lambda e: e.name)

    def __len__(self) -> int:
        return len(self.entries())

    def verify(self, token: str) -> TokenEntry | None:
        """The entry whose secret `token` carries, or None. Costs one scrypt unless the result is cached
        (good or bad) or another thread is hashing the same token now (then it waits for that result)."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            return None
        name, dot, secret = token.partition(".")
        if not dot or not secret or not NAME.fullmatch(name):
            return None
        key = hmac.new(self._cache_key, token.encode(), hashlib.sha256).digest()
        while True:
            with self._lock:
                self._reload()
                hit = self._cache.get(key)
                if hit is not None and hit[0] > time.monotonic():
                    return hit[1]
                pending = self._pending.get(key)
                if pending is None:
                    entry = self._entries.get(name)
                    done = self._pending[key] = threading.Event()
                    break
            pending.wait()  # the same token is being hashed: its result lands in the cache
        try:
            if entry is not None:
                with self._lock:
                    self.scrypt_calls += 1
            verified = entry if entry is not None and entry.matches(secret) else None
            with self._lock:
                if self._entries.get(name) is entry:  # the file did not change meanwhile
                    self._cache[key] = (time.monotonic() + self._cache_ttl_s, verified)
                    self._cache.move_to_end(key)
                    while len(self._cache) > self._cache_entries:
                        self._cache.popitem(last=False)
            return verified
        finally:
            with self._lock:
                self._pending.pop(key, None)
            done.set()

    # -- writing ---------------------------------------------------------------------------------
    def add(self, name: str, *, role: str, replace: bool = False) -> str:
        """Create a token for `name` with `role`; returns the token (the only time it is seen)."""
        check_name(name)
        check_role(role)
        secret = secrets.token_urlsafe(32)
        salt = secrets.token_bytes(16)
        digest = hashlib.scrypt(secret.encode(), salt=salt, dklen=32, maxmem=64 << 20, **_SCRYPT)
        entry = TokenEntry(name=name, role=role, salt=salt, digest=digest, created_unix=time.time(), **_SCRYPT)
        with self._lock, self._file_lock():
            self._stamp = None  # read what another process may have written: the lock is held now
            self._reload()
            if name in self._entries and not replace:
                raise TokenError(f"a token named {name!r} exists already (revoke it first, or replace it)")
            self._write({**self._entries, name: entry})
        return f"{name}.{secret}"

    def revoke(self, name: str) -> None:
        with self._lock, self._file_lock():
            self._stamp = None
            self._reload()
            if name not in self._entries:
                raise TokenError(f"no token named {name!r} in {self.path}")
            self._write({k: v for k, v in self._entries.items() if k != name})

    @contextlib.contextmanager
    def _file_lock(self):
        """An exclusive flock on `.<file>.lock` beside the tokens file, across processes (edits only)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(f".{self.path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def _write(self, entries: dict[str, TokenEntry]) -> None:
        doc = {"format": "tether-tokens/1", "hash": "scrypt",
               "tokens": {name: e.to_json() for name, e in sorted(entries.items())}}
        write_private(self.path, json.dumps(doc, indent=1).encode() + b"\n")
        self._stamp = None
        self._reload()


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically and durably (file and folder fsynced), readable by its owner only."""
    write_atomic(path, data, mode=0o600)
