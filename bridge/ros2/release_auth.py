"""Who may release an edge node's e-stop: a credential per operator that the node verifies.

The release travels on `/tether/estop_release` (std_msgs/String), which anyone on the DDS domain
can read and write, so it carries neither the token nor anything that works twice:

    operator|node|t_ns|why|mac        mac = HMAC-SHA256(K, "operator|node|t_ns|why"), hex

K = scrypt(token, salt derived from the operator's name) is what the node's release tokens file
keeps per operator (never the token; mode 0600: K verifies and could also sign, so it is a secret).
The operator's side derives the same K from the token. The node accepts a release only for its
own node name, with a valid MAC, signed within `window_s` of its clock (either way: clock skew),
not before the node loaded the file (a message captured before a restart does not work after it),
and never the same MAC twice.

    tether edge token add ada --tokens /etc/tether/release_tokens.json   # prints ada.<secret> once
    tether edge --release-tokens /etc/tether/release_tokens.json ...      # the node
    tether edge release --operator ada --token-file ~/.tether/ada.token --node tether_edge --reason "cell clear"

In code (scrypt parameters lowered here only to keep the example fast):

    >>> import tempfile; path = Path(tempfile.mkdtemp()) / "release_tokens.json"
    >>> token = add_operator(path, "ada", scrypt_n=1 << 10)
    >>> authority = ReleaseAuthority.load(path)
    >>> text = make_release("ada", token, node="arm_1", why="cell clear", scrypt_n=1 << 10)
    >>> authority.verify(text, node="arm_1")
    ('ada', 'cell clear')
    >>> authority.verify(text, node="arm_1")
    Traceback (most recent call last):
    ...
    bridge.ros2.release_auth.ReleaseError: replayed: this release (by 'ada') was accepted once already
    >>> try:                                     # no tokens file: every release is refused
    ...     ReleaseAuthority.load(None).verify(text, node="arm_1")
    ... except ReleaseError as exc:
    ...     print(exc.code)
    not configured
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bridge.common.errors import CommandError
from bridge.security.tokens import MAX_TOKEN_CHARS, NAME, TokenError, check_name, write_private

__all__ = ["DEFAULT_NODE", "FORMAT", "TOKEN_ENV", "ReleaseAuthority", "ReleaseError", "ReleaseSigner", "add_operator",
           "main", "make_release", "read_token", "revoke_operator"]

FORMAT = "tether-release-tokens/1"
DEFAULT_NODE = "tether_edge"            # `tether edge --node-name`'s default: the node a release is for
TOKEN_ENV = "TETHER_RELEASE_TOKEN"      # the operator's token, when neither --token nor --token-file is given
WINDOW_S = 30.0                         # a release is fresh within this many seconds of the node's clock
MAX_WHY_CHARS = 200
MAX_RELEASE_CHARS = 1024
_SCRYPT = {"n": 1 << 14, "r": 8, "p": 1}  # as the gateway's tokens (bridge.security.tokens): ~50 ms, 16 MiB
_SALT_PREFIX = b"tether-edge-release/1\0"


class ReleaseError(ValueError):
    """A release refused, or a release tokens file that cannot be used. `code` says why in one word
    or two ("malformed", "unknown operator", "wrong node", "stale", "bad mac", "replayed", ...);
    the message starts with it and explains."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code


def _check_node(node: object) -> str:
    if not isinstance(node, str) or not node.strip() or "|" in node or not node.isprintable():
        raise ValueError(f"node: expected the edge node's name (printable, no '|'), got {node!r}")
    return node.strip()


def _check_why(why: object) -> str:
    if not isinstance(why, str) or not why.isprintable() or len(why) > MAX_WHY_CHARS:
        raise ValueError(f"why: expected at most {MAX_WHY_CHARS} printable characters, got {why!r}")
    return why.strip()


def _check_token(operator: str, token: object) -> str:
    if not isinstance(token, str) or not token.strip() or len(token.strip()) > MAX_TOKEN_CHARS:
        raise ValueError(f"token: expected the operator's release token (1-{MAX_TOKEN_CHARS} characters)")
    token = token.strip()
    name, dot, secret = token.partition(".")
    if dot and NAME.fullmatch(name) and name != operator:
        raise ValueError(f"token: this token is for {name!r}, not {operator!r}")
    if not secret and dot:
        raise ValueError("token: nothing after the name")
    return token


def derive_key(operator: str, token: str, *, n: int = _SCRYPT["n"], r: int = _SCRYPT["r"],
               p: int = _SCRYPT["p"]) -> bytes:
    """K = scrypt(token, salt from the operator's name): what the node keeps and the operator signs with."""
    operator = check_name(operator)
    token = _check_token(operator, token)
    salt = hashlib.sha256(_SALT_PREFIX + operator.encode()).digest()
    return hashlib.scrypt(token.encode(), salt=salt, n=n, r=r, p=p, dklen=32, maxmem=64 << 20)


def _mac(key: bytes, fields: str) -> str:
    return hmac.new(key, fields.encode(), hashlib.sha256).hexdigest()


class ReleaseSigner:
    """The operator's side: derives K once (one scrypt), then signs any number of releases
    (each with its own time, so a resend is a new message, not a replay)."""

    def __init__(self, operator: str, token: str, *, scrypt_n: int = _SCRYPT["n"]):
        self.operator = check_name(operator)
        self._key = derive_key(self.operator, token, n=scrypt_n)

    def sign(self, *, node: str, why: str = "", t_ns: int | None = None) -> str:
        t_ns = time.time_ns() if t_ns is None else int(t_ns)
        fields = f"{self.operator}|{_check_node(node)}|{t_ns}|{_check_why(why)}"
        return f"{fields}|{_mac(self._key, fields)}"


def make_release(operator: str, token: str, *, node: str, why: str = "", t_ns: int | None = None,
                 scrypt_n: int = _SCRYPT["n"]) -> str:
    """The text of one authenticated release of node `node`'s e-stop by `operator` (see the module doc)."""
    return ReleaseSigner(operator, token, scrypt_n=scrypt_n).sign(node=node, why=why, t_ns=t_ns)


def read_token(*, token: str | None = None, token_file: Path | None = None,
               env: dict[str, str] | None = None) -> str:
    """The operator's token: `token`, else the first line of `token_file`, else $TETHER_RELEASE_TOKEN.
    ValueError naming all three if none is given."""
    if token:
        return token.strip()
    if token_file is not None:
        try:
            text = Path(token_file).read_text().strip()
        except OSError as exc:
            raise ValueError(f"--token-file: cannot read {token_file}: {exc}") from None
        if not text:
            raise ValueError(f"--token-file: {token_file} is empty")
        return text.splitlines()[0].strip()
    value = (os.environ if env is None else env).get(TOKEN_ENV, "").strip()
    if not value:
        raise ValueError(f"a release needs the operator's token: --token, --token-file or ${TOKEN_ENV} "
                         "(issued by `tether edge token add NAME --tokens FILE` on the robot)")
    return value


# -- the node's side -----------------------------------------------------------------------------

@dataclass(frozen=True)
class _Operator:
    name: str
    key: bytes
    created_unix: float


def _read(path: Path) -> dict[str, _Operator]:
    """The operators of a release tokens file; ReleaseError naming the file and the problem."""
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise ReleaseError("no tokens file", f"{path} does not exist (create it with "
                           f"`tether edge token add NAME --tokens {path}`)") from None
    except (OSError, ValueError) as exc:
        raise ReleaseError("bad tokens file", f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("operators"), dict):
        raise ReleaseError("bad tokens file", f"{path} is not a {FORMAT} file (no 'operators' object)")
    out = {}
    for name, entry in doc["operators"].items():
        try:
            check_name(name)
            key = bytes.fromhex(entry["key"])
            if len(key) != 32:
                raise ValueError(f"key of {len(key)} bytes, expected 32")
            out[name] = _Operator(name=name, key=key, created_unix=float(entry.get("created_unix", 0.0)))
        except (TokenError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ReleaseError("bad tokens file", f"{path}: operator {name!r}: malformed entry ({exc})") from None
    return out


class ReleaseAuthority:
    """The node's check of releases against its release tokens file (re-read when the file changes,
    so `tether edge token add|revoke` takes effect in a running node). Thread-safe.

    `clock` is wall-clock nanoseconds (the operator's machine signs with its own); `window_s`
    bounds the difference either way. Releases signed before `load` are refused."""

    def __init__(self, path: Path | None, *, clock: Callable[[], int] = time.time_ns, window_s: float = WINDOW_S):
        self.path = None if path is None else Path(path)
        self._clock = clock
        self._window_ns = int(window_s * 1e9)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._operators: dict[str, _Operator] = {}
        self._seen: dict[str, int] = {}            # mac -> t_ns, forgotten once out of the window
        self.not_before_ns = clock()
        if self.path is not None:
            self._reload()

    @classmethod
    def load(cls, path: Path | None, **kwargs) -> ReleaseAuthority:
        """The authority of a release tokens file; ReleaseError if it cannot be read. `None`: no
        file configured, every release is refused (with a message saying how to configure one)."""
        return cls(path, **kwargs)

    @property
    def operators(self) -> list[str]:
        with self._lock:
            if self.path is not None:
                self._reload()
            return sorted(self._operators)

    def _reload(self) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp is not None and stamp == self._stamp:
            return
        self._operators, self._stamp = {}, None     # a file that breaks refuses everyone until fixed
        self._operators, self._stamp = _read(self.path), stamp

    def verify(self, text: object, *, node: str) -> tuple[str, str]:
        """(operator, why) of a valid release of node `node`; ReleaseError saying why it was refused."""
        if self.path is None:
            raise ReleaseError("not configured", "this node has no release tokens file, so it refuses every "
                               "local release; create one with `tether edge token add NAME --tokens FILE` and "
                               "start the node with --release-tokens FILE")
        if not isinstance(text, str) or len(text) > MAX_RELEASE_CHARS:
            raise ReleaseError("malformed", f"expected at most {MAX_RELEASE_CHARS} characters of "
                               "'operator|node|t_ns|why|mac'")
        head = text.split("|", 3)
        rest = head[3].rsplit("|", 1) if len(head) == 4 else []
        if len(rest) != 2:
            shown = text if len(text) <= 60 else text[:57] + "..."
            raise ReleaseError("malformed", f"{shown!r} is not 'operator|node|t_ns|why|mac' (an unauthenticated "
                               "release? `tether edge release` signs it with the operator's token)")
        operator, target, t_text, (why, mac) = head[0], head[1], head[2], rest
        if not t_text.isdigit() or len(mac) != 64:
            raise ReleaseError("malformed", f"release by {operator!r}: t_ns {t_text!r} or the mac is not well-formed")
        if target != node:
            raise ReleaseError("wrong node", f"release by {operator!r} is for node {target!r}, this is {node!r}")
        t_ns = int(t_text)
        with self._lock:
            self._reload()
            entry = self._operators.get(operator)
            if entry is None:
                raise ReleaseError("unknown operator", f"{operator!r} has no release token in {self.path}")
            if not hmac.compare_digest(_mac(entry.key, "|".join((operator, target, t_text, why))), mac.lower()):
                raise ReleaseError("bad mac", f"release by {operator!r}: the MAC does not match (wrong token, "
                                   "or the message was altered)")
            now = self._clock()
            if abs(now - t_ns) > self._window_ns:
                raise ReleaseError("stale", f"release by {operator!r} was signed {(now - t_ns) / 1e9:+.1f} s from "
                                   f"this node's clock; accepted within {self._window_ns / 1e9:g} s (clocks in sync?)")
            if t_ns < self.not_before_ns:
                raise ReleaseError("stale", f"release by {operator!r} was signed before this node loaded its "
                                   "release tokens (a message from before a restart is not accepted)")
            self._seen = {m: t for m, t in self._seen.items() if abs(now - t) <= self._window_ns}
            if mac.lower() in self._seen:
                raise ReleaseError("replayed", f"this release (by {operator!r}) was accepted once already")
            self._seen[mac.lower()] = t_ns
        return operator, why.strip()


# -- editing the node's tokens file --------------------------------------------------------------

@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive flock on `.<file>.lock` beside the tokens file, held across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _entries(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    _read(path)                                   # validates, with a clear error
    return json.loads(path.read_bytes())["operators"]


def _write(path: Path, operators: dict[str, dict]) -> None:
    doc = {"format": FORMAT, "kdf": "scrypt", "mac": "hmac-sha256", "operators": dict(sorted(operators.items()))}
    write_private(path, json.dumps(doc, indent=1).encode() + b"\n")   # atomic, 0600, file + folder fsynced


def add_operator(path: Path, name: str, *, replace: bool = False, scrypt_n: int = _SCRYPT["n"]) -> str:
    """Give `name` a release token: returns it (`name.<secret>`, the only time it is seen) and keeps
    only K in `path` (created mode 0600 if missing). ReleaseError if `name` has one already."""
    path, name = Path(path), check_name(name)
    token = f"{name}.{secrets.token_urlsafe(32)}"
    key = derive_key(name, token, n=scrypt_n)
    with _locked(path):
        operators = _entries(path)
        if name in operators and not replace:
            raise ReleaseError("exists", f"{name!r} has a release token in {path} already (revoke it, or replace it)")
        operators[name] = {"key": key.hex(), "n": scrypt_n, "r": _SCRYPT["r"], "p": _SCRYPT["p"],
                           "created_unix": time.time()}
        _write(path, operators)
    return token


def revoke_operator(path: Path, name: str) -> None:
    """Remove `name`'s release token from `path`; ReleaseError if it has none."""
    path = Path(path)
    with _locked(path):
        operators = _entries(path)
        if name not in operators:
            raise ReleaseError("unknown operator", f"{name!r} has no release token in {path}")
        del operators[name]
        _write(path, operators)


def parser() -> argparse.ArgumentParser:
    """`tether edge token`'s flags."""
    p = argparse.ArgumentParser(prog="tether edge token", description="Release tokens of an edge node: who may "
                                "release its e-stop on the robot (the node keeps only a hash of each)")
    p.add_argument("action", choices=("add", "revoke", "list"), help="add (prints it once), revoke, list")
    p.add_argument("name", nargs="?", help="the operator (add, revoke)")
    p.add_argument("--tokens", type=Path, required=True, help="the node's release tokens file (--release-tokens)")
    p.add_argument("--replace", action="store_true", help="add: replace an existing token of NAME")
    return p


def main(argv: list[str]) -> None:
    """`tether edge token add|revoke|list --tokens FILE [NAME]`: the node's release tokens."""
    p = parser()
    a = p.parse_args(argv)
    if a.action != "list" and not a.name:
        p.error(f"{a.action}: NAME is required")
    try:
        if a.action == "add":
            token = add_operator(a.tokens, a.name, replace=a.replace)
            print(f"release token for {a.name} (shown once; give it to {a.name}, e.g. as ${TOKEN_ENV} or a "
                  f"--token-file readable by them only):\n{token}", flush=True)
        elif a.action == "revoke":
            revoke_operator(a.tokens, a.name)
            print(f"revoked {a.name}'s release token in {a.tokens}", flush=True)
        else:
            for name in ReleaseAuthority.load(a.tokens).operators:
                print(name)
    except (ReleaseError, TokenError) as exc:
        raise CommandError(exc, prog=p.prog) from None
