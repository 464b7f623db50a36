"""The experience stream on NATS JetStream: its name, subjects, headers, and how to reach it.

    servers = parse_servers("tls://10.0.0.5:4222,tls://10.0.0.6:4222")
    auth = NatsAuth(user="gateway", password_file=Path("lab/nats/gateway.password"), ca=Path("lab/ca.crt"))
    nc = await connect(servers, name="tether-gateway", auth=auth)
    info = await ensure_stream(nc.jetstream(), replicas=3, create=False)   # the admin created it; checked
    subject_of("robot-1/0")         # 'tether.experience.robot-1%2F0'
    session_of(subject_of("a.b"))   # 'a.b'
    transition_of(msg)              # a consumed message's Transition, or PoisonedMessage saying why not

One stream (`TETHER_EXPERIENCE`) holds every session's transitions, one subject per session
(`tether.experience.<session, %-escaped>`), each message one serialized `tether.v1.Transition` with
the headers `Nats-Msg-Id: <session>:<step>` (the stream drops a retry of a message it has within its
duplicate window) and `Tether-Owner-Epoch` (the gateway's ownership epoch of the session when it logged
it; 0 without ownership). Consumers (trainers, the archiver)
number transitions by the stream sequence: `Transition.offset = sequence - 1`.

Credentials (`NatsAuth`; flags `--nats-user NAME --nats-password-file PATH --nats-ca PATH` on every
client command): a user name, its password read from a 0600 file (never in argv, URLs, logs or errors),
the CA that verifies the servers' TLS certificate. A client's reply subjects are `_INBOX.<user>.>`, so
the server lets each role subscribe to its own inboxes only (tether.cluster.nats's permissions).

What comes back from the stream is data, not control: a message id is `<session>:<step>` with ASCII
digits only, and a consumer takes a message only when its subject, msg id and body name the same
session and step (`transition_of`); anything else is a `PoisonedMessage` to count and pass over.
"""

from __future__ import annotations

import argparse
import logging
import re
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tether.experience")
# TLS failures that end one connection, not a refusal of us: the client reconnects (seen under load: a server
# closing a connection it had just accepted)
_TRANSIENT = frozenset({"APPLICATION_DATA_AFTER_CLOSE_NOTIFY"})

__all__ = ["MAX_MSG_BYTES", "STREAM", "SUBJECT_PREFIX", "ExperienceStreamError", "NatsAuth", "PoisonedMessage",
           "add_nats_arguments", "connect", "ensure_stream", "headers_of", "nats_auth_from", "parse_msg_id",
           "parse_servers", "session_of", "step_of", "subject_of", "transition_of"]

STREAM = "TETHER_EXPERIENCE"
SUBJECT_PREFIX = "tether.experience"
DUPLICATE_WINDOW_S = 120.0  # a retry within this of the first publish is dropped by the stream (msg id)
MSG_ID, OWNER_EPOCH = "Nats-Msg-Id", "Tether-Owner-Epoch"
# the stream's max_msg_size (and nats-server's max_payload, tether.cluster.nats): a raw 1080p RGB frame (6.2 MB)
# with its joint state, or a few JPEG camera frames, fits in one transition; nats-server advises <= 8 MB
MAX_MSG_BYTES = 8 << 20
_MSG_ID = re.compile(r"(?P<session>.+):(?P<step>[0-9]{1,19})", re.DOTALL)  # [0-9]: ASCII digits only ("²" is not)
_USER = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class ExperienceStreamError(RuntimeError):
    """The experience stream cannot be reached, created, or does not fit (the message says which)."""


class PoisonedMessage(ValueError):
    """A message on the stream that is not a transition of the session its subject names (the message says why)."""


@dataclass(frozen=True)
class NatsAuth:
    """A NATS client's credentials: `user` with the password in `password_file` (0600), and/or `ca`, the CA that
    verifies the servers' TLS certificate (then every connection is TLS). The default: open, plaintext.

    >>> NatsAuth().inbox_prefix, NatsAuth(user="trainer", password_file=Path("p")).inbox_prefix
    ('_INBOX', '_INBOX.trainer')
    >>> NatsAuth(user="a.b", password_file=Path("p"))
    Traceback (most recent call last):
    ValueError: NATS user 'a.b' must be 1-64 of [A-Za-z0-9_-]
    """

    user: str = ""
    password_file: Path | None = None
    ca: Path | None = None

    def __post_init__(self):
        if self.user and not _USER.fullmatch(self.user):
            raise ValueError(f"NATS user {self.user!r} must be 1-64 of [A-Za-z0-9_-]")
        if bool(self.user) != (self.password_file is not None):
            raise ValueError(f"NATS user ({self.user!r}) and password file ({self.password_file}) go together")

    @property
    def inbox_prefix(self) -> str:
        """The prefix of this client's reply subjects: its user's own (the server allows it to subscribe there)."""
        return f"_INBOX.{self.user}" if self.user else "_INBOX"

    def password(self) -> str:
        """The password file's first line; ValueError naming the file (never its content)."""
        try:
            text = Path(self.password_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"NATS password file {self.password_file}: cannot read it ({type(exc).__name__})") \
                from None
        secret = text.splitlines()[0].strip() if text.strip() else ""
        if not secret:
            raise ValueError(f"NATS password file {self.password_file} is empty")
        return secret

    def tls_context(self) -> ssl.SSLContext | None:
        """A client TLS context verifying against `ca` (None without one)."""
        if self.ca is None:
            return None
        try:
            return ssl.create_default_context(cafile=str(self.ca))
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"NATS CA {self.ca}: {exc}") from None


def add_nats_arguments(p: argparse.ArgumentParser) -> None:
    """The NATS client flags, one spelling for every command (gateway, `tether train`, `tether archive`)."""
    p.add_argument("--nats-user", default="", metavar="NAME", help="NATS user (the role: gateway, trainer, archiver)")
    p.add_argument("--nats-password-file", type=Path, metavar="PATH",
                   help="file holding the NATS user's password (0600; never on the command line)")
    p.add_argument("--nats-ca", type=Path, metavar="PATH",
                   help="CA certificate the NATS servers' TLS certificates are verified with (connect over TLS)")


def nats_auth_from(a: argparse.Namespace) -> NatsAuth:
    """The NatsAuth of `add_nats_arguments`'s flags (ValueError naming a bad one)."""
    return NatsAuth(user=a.nats_user, password_file=a.nats_password_file, ca=a.nats_ca)


def parse_servers(value: str | Sequence[str]) -> list[str]:
    """`nats://H:P[,nats://H:P...]` (or a list of them) as a list; ValueError naming a bad one.

    >>> parse_servers("nats://127.0.0.1:4222, nats://127.0.0.1:4223")
    ['nats://127.0.0.1:4222', 'nats://127.0.0.1:4223']
    """
    items = [s.strip() for s in (value.split(",") if isinstance(value, str) else value) if s.strip()]
    if not items:
        raise ValueError(f"no NATS server in {value!r} (nats://HOST:PORT[,nats://HOST:PORT...])")
    for item in items:
        scheme, sep, rest = item.partition("://")
        if "@" in rest:  # a password in a URL reaches argv, logs and errors: refused without echoing it
            raise ValueError(f"NATS server {scheme}{sep}...@{rest.rpartition('@')[2]} carries credentials in "
                             "the URL: give --nats-user and --nats-password-file instead")
        host, colon, port = rest.rpartition(":")
        if scheme not in ("nats", "tls") or not sep or not colon or not host or not port.isdigit():
            raise ValueError(f"NATS server {item!r} is not nats://HOST:PORT")
    return items


def subject_of(session: str) -> str:
    """The subject of `session`'s transitions: bytes other than [A-Za-z0-9_-] are %XX-escaped (NATS subjects
    may not hold '.', '*', '>' or spaces inside a token).

    >>> subject_of("robot-1/0"), subject_of("a b.c")
    ('tether.experience.robot-1%2F0', 'tether.experience.a%20b%2Ec')
    """
    if not session:
        raise ValueError("a transition needs a session id (got an empty one)")
    token = "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in session.encode())
    return f"{SUBJECT_PREFIX}.{token}"


def session_of(subject: str) -> str:
    """The session of a subject made by `subject_of`.

    >>> session_of("tether.experience.robot-1%2F0")
    'robot-1/0'
    """
    prefix = SUBJECT_PREFIX + "."
    if not subject.startswith(prefix):
        raise ValueError(f"subject {subject!r} is not under {prefix}")
    token = subject[len(prefix):].encode()
    out, i = bytearray(), 0
    while i < len(token):
        if token[i:i + 1] == b"%":
            out.append(int(token[i + 1:i + 3], 16))
            i += 3
        else:
            out.append(token[i])
            i += 1
    return out.decode()


def headers_of(session: str, step: int, owner_epoch: int) -> dict[str, str]:
    """The headers of a transition's message: its msg id (idempotent retries) and the ownership epoch.

    >>> headers_of("robot-1", 7, 2)
    {'Nats-Msg-Id': 'robot-1:7', 'Tether-Owner-Epoch': '2'}
    """
    return {MSG_ID: f"{session}:{step}", OWNER_EPOCH: str(owner_epoch)}


def parse_msg_id(msg_id: object) -> tuple[str, int] | None:
    """(session, step) of a msg id `<session>:<step>` (step: 1-19 ASCII digits, < 2**63); None if it is not one.

    >>> parse_msg_id("a:b:12"), parse_msg_id("s:²"), parse_msg_id("s:1e3"), parse_msg_id("s:-1"), parse_msg_id(":3")
    (('a:b', 12), None, None, None, None)
    """
    m = _MSG_ID.fullmatch(msg_id) if isinstance(msg_id, str) else None
    if m is None or int(m["step"]) >= 1 << 63:
        return None
    return m["session"], int(m["step"])


def step_of(headers: dict | None, session: str | None = None) -> int | None:
    """The step a message's msg id names (`<session>:<step>`); None without a well-formed one, or (with
    `session`) when the id names another session.

    >>> step_of({"Nats-Msg-Id": "a:b:12"}), step_of(None), step_of({"Nats-Msg-Id": "s:²"})
    (12, None, None)
    >>> step_of({"Nats-Msg-Id": "other:7"}, "s"), step_of({"Nats-Msg-Id": "s:7"}, "s")
    (None, 7)
    """
    parsed = parse_msg_id((headers or {}).get(MSG_ID))
    if parsed is None or (session is not None and parsed[0] != session):
        return None
    return parsed[1]


def transition_of(subject: str, data: bytes, headers: dict | None):
    """The `tether.v1.Transition` of a stream message, checked: its subject is under the prefix, its body parses,
    its msg id is `<session>:<step>` with the session of the subject and of the body and the body's step.
    PoisonedMessage says which check failed (naming only lengths and well-formed values, never the raw bytes).

    >>> transition_of("tether.experience.s", b"\\xff", {MSG_ID: "s:1"})
    Traceback (most recent call last):
    bridge.experience.jetstream.PoisonedMessage: the body (1 bytes) is not a tether.v1.Transition
    """
    from google.protobuf.message import DecodeError

    from protos import experience_pb2

    try:
        session = session_of(subject)
    except (ValueError, UnicodeDecodeError, IndexError):
        raise PoisonedMessage(f"subject ({len(subject)} chars) is not a session subject under "
                              f"{SUBJECT_PREFIX}.") from None
    try:
        t = experience_pb2.Transition.FromString(data)
    except (DecodeError, RuntimeWarning, ValueError):
        raise PoisonedMessage(f"the body ({len(data)} bytes) is not a tether.v1.Transition") from None
    parsed = parse_msg_id((headers or {}).get(MSG_ID))
    if parsed is None:
        raise PoisonedMessage(f"session {session!r}: no well-formed {MSG_ID} (<session>:<ASCII digits>)")
    if not (parsed[0] == session == t.session and parsed[1] == t.step):
        raise PoisonedMessage(f"subject session {session!r}, msg id {parsed[0]!r}:{parsed[1]} and body "
                              f"{t.session!r}:{t.step} do not agree")
    return t


async def connect(servers: Sequence[str], *, name: str, auth: NatsAuth | None = None,
                  on_error: Callable[[Exception], None] | None = None, connect_timeout_s: float = 10.0):
    """A nats-py connection to any of `servers` that reconnects for ever (0.1 s between tries), with `auth`'s
    credentials and TLS. A refusal while connecting ('Authorization Violation', a certificate that does not
    verify) raises ExperienceStreamError with the server's answer at once, as does no connection within
    `connect_timeout_s`; later errors (a 'Permissions Violation' the server answers) go to `on_error` and the log."""
    import asyncio
    import contextlib

    from nats.aio.client import Client
    from nats.errors import NoServersError

    auth = auth or NatsAuth()
    answers: list[Exception] = []
    refused: asyncio.Future = asyncio.get_running_loop().create_future()

    async def error(exc: Exception) -> None:  # a server died or refused: nats-py retries the others
        answers.append(exc)
        del answers[:-8]
        text = f"{exc!s} {exc!r}".lower()  # nats-py lowercases some of the server's -ERR answers
        if "permissions violation" in text:
            log.warning("NATS (%s, user %r): %s", name, auth.user, exc)
        else:
            log.info("NATS (%s): %r", name, exc)
        if not refused.done() and not nc.is_connected and (
                "authorization violation" in text or (isinstance(exc, ssl.SSLError) and exc.reason not in _TRANSIENT)):
            refused.set_result(exc)
        if on_error is not None:
            on_error(exc)

    async def disconnected() -> None:
        log.info("NATS (%s): disconnected, reconnecting", name)

    try:
        tls = auth.tls_context()
        credentials = {"user": auth.user, "password": auth.password()} if auth.user else {}
    except ValueError as exc:  # names the file, never its content
        raise ExperienceStreamError(str(exc)) from None
    if tls is None and any(s.startswith("tls://") for s in servers):
        tls = ssl.create_default_context()  # tls:// without --nats-ca: the system's CAs
    who = f" as user {auth.user!r}" if auth.user else ""
    nc = Client()
    attempt = asyncio.ensure_future(nc.connect(
        servers=list(servers), name=name, connect_timeout=min(2.0, connect_timeout_s), error_cb=error,
        disconnected_cb=disconnected, max_reconnect_attempts=-1, reconnect_time_wait=0.1, allow_reconnect=True,
        ping_interval=5, max_outstanding_pings=3, tls=tls, inbox_prefix=auth.inbox_prefix, **credentials,
        pending_size=64 << 20))  # what nc.publish buffers while reconnecting
    try:
        await asyncio.wait({attempt, refused}, timeout=connect_timeout_s, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        attempt.cancel()
        raise
    if attempt.done() and not attempt.cancelled() and attempt.exception() is None:
        return nc
    if not attempt.done():
        attempt.cancel()
    failure = refused.result() if refused.done() else (
        attempt.exception() if attempt.done() and not attempt.cancelled() else None)
    with contextlib.suppress(Exception):  # giving up on it anyway
        await asyncio.wait_for(nc.close(), 2.0)
    if refused.done():
        raise ExperienceStreamError(f"NATS at {','.join(servers)} refused the connection{who}: {failure!s} "
                                    f"({type(failure).__name__})")
    why = answers[-1] if answers else failure
    if failure is None or isinstance(failure, (NoServersError, OSError, TimeoutError, ssl.SSLError)):
        state = f"no connection within {connect_timeout_s:g} s" if failure is None else type(failure).__name__
        raise ExperienceStreamError(f"cannot connect to NATS at {','.join(servers)}{who} ({state}): {why!s} "
                                    f"({type(why).__name__})")
    raise ExperienceStreamError(f"NATS at {','.join(servers)} refused the connection{who}: {failure!s} "
                                f"({type(failure).__name__})")


async def ensure_stream(js, *, stream: str = STREAM, replicas: int = 1, max_age_s: float = 0.0,
                        max_bytes: int = -1, timeout_s: float = 30.0, create: bool = True,
                        duplicate_window_s: float = DUPLICATE_WINDOW_S, max_msg_bytes: int = MAX_MSG_BYTES):
    """The stream's info, creating it (file storage, `replicas`, the duplicate window, `max_msg_bytes`) if absent
    and `create`, and then updating its max_msg_size and duplicate window where they differ. Without `create` (a role
    that may not manage the stream: the admin made it) it waits for the stream to exist. Retries while
    JetStream has no leader yet (a cluster just started or electing); ExperienceStreamError after `timeout_s`."""
    import asyncio
    import time

    from nats.js.api import StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    deadline = time.monotonic() + timeout_s
    config = StreamConfig(name=stream, subjects=[f"{SUBJECT_PREFIX}.>"], storage=StorageType.FILE,
                          num_replicas=replicas, duplicate_window=duplicate_window_s, max_age=max_age_s,
                          max_bytes=max_bytes, max_msg_size=max_msg_bytes, allow_direct=True)
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            try:
                info = await js.stream_info(stream)
            except NotFoundError:
                if not create:
                    last = ExperienceStreamError(f"stream {stream} does not exist (the NATS admin creates it: "
                                                 "tether.cluster.nats.NatsCluster.create_stream)")
                    await asyncio.sleep(0.2)
                    continue
                info = await js.add_stream(config)
                log.info("created the experience stream %s (%d replicas)", stream, replicas)
            if create and (info.config.max_msg_size != max_msg_bytes
                           or info.config.duplicate_window != duplicate_window_s):
                info = await js.update_stream(info.config.evolve(max_msg_size=max_msg_bytes,
                                                                 duplicate_window=duplicate_window_s))
                log.info("experience stream %s: max_msg_size %d bytes, duplicate window %g s", stream,
                         max_msg_bytes, duplicate_window_s)
            if info.config.num_replicas != replicas:
                log.warning("experience stream %s has %s replicas, not the %d asked for (kept as it is)", stream,
                            info.config.num_replicas, replicas)
            return info
        except Exception as exc:  # noqa: BLE001 - no leader yet, a timeout, a reconnect: retried until the deadline
            last = exc
            await asyncio.sleep(0.2)
    raise ExperienceStreamError(f"experience stream {stream}: not available after {timeout_s:g} s: {last!r}")
