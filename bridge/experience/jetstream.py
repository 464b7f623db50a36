"""The experience stream on NATS JetStream: its name, subjects, headers, and how to reach it.

    servers = parse_servers("nats://10.0.0.5:4222,nats://10.0.0.6:4222")
    nc = await connect(servers, name="tether-gateway")
    info = await ensure_stream(nc.jetstream(), replicas=3)   # created if absent, else checked
    subject_of("robot-1/0")         # 'tether.experience.robot-1%2F0'
    session_of(subject_of("a.b"))   # 'a.b'

One stream (`TETHER_EXPERIENCE`) holds every session's transitions, one subject per session
(`tether.experience.<session, %-escaped>`), each message one serialized `tether.v1.Transition` with
the headers `Nats-Msg-Id: <session>:<step>` (the stream drops a retry of a message it has within its
duplicate window) and `Tether-Owner-Epoch` (the gateway's ownership epoch of the session when it logged
it; 0 without ownership). Consumers (trainers, the archiver)
number transitions by the stream sequence: `Transition.offset = sequence - 1`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

log = logging.getLogger("tether.experience")

__all__ = ["STREAM", "SUBJECT_PREFIX", "ExperienceStreamError", "connect", "ensure_stream", "headers_of",
           "parse_servers", "session_of", "step_of", "subject_of"]

STREAM = "TETHER_EXPERIENCE"
SUBJECT_PREFIX = "tether.experience"
DUPLICATE_WINDOW_S = 120.0  # a retry within this of the first publish is dropped by the stream (msg id)
MSG_ID, OWNER_EPOCH = "Nats-Msg-Id", "Tether-Owner-Epoch"
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class ExperienceStreamError(RuntimeError):
    """The experience stream cannot be reached, created, or does not fit (the message says which)."""


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


def step_of(headers: dict | None) -> int | None:
    """The step a message's msg id names (`<session>:<step>`), None without one.

    >>> step_of({"Nats-Msg-Id": "a:b:12"}), step_of(None)
    (12, None)
    """
    msg_id = (headers or {}).get(MSG_ID, "")
    _, colon, step = msg_id.rpartition(":")
    return int(step) if colon and step.isdigit() else None


async def connect(servers: Sequence[str], *, name: str, connect_timeout_s: float = 10.0):
    """A nats-py connection to any of `servers` that reconnects for ever (0.1 s between tries)."""
    import nats
    from nats.errors import NoServersError

    async def error(exc: Exception) -> None:  # a server died or refused a reconnect: nats-py retries the others
        log.info("NATS (%s): %r", name, exc)

    async def disconnected() -> None:
        log.info("NATS (%s): disconnected, reconnecting", name)

    try:
        return await nats.connect(servers=list(servers), name=name, connect_timeout=min(2.0, connect_timeout_s),
                                  error_cb=error, disconnected_cb=disconnected,
                                  max_reconnect_attempts=-1, reconnect_time_wait=0.1, allow_reconnect=True,
                                  ping_interval=5, max_outstanding_pings=3,
                                  pending_size=64 << 20)  # what nc.publish buffers while reconnecting
    except (NoServersError, OSError, TimeoutError) as exc:
        raise ExperienceStreamError(f"cannot reach NATS at {','.join(servers)}: {exc!r}") from exc


async def ensure_stream(js, *, stream: str = STREAM, replicas: int = 1, max_age_s: float = 0.0,
                        max_bytes: int = -1, timeout_s: float = 30.0):
    """The stream's info, creating it (file storage, `replicas`, the duplicate window) if absent. Retries
    while JetStream has no leader yet (a cluster just started or electing); ExperienceStreamError after
    `timeout_s`."""
    import asyncio
    import time

    from nats.js.api import StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    deadline = time.monotonic() + timeout_s
    config = StreamConfig(name=stream, subjects=[f"{SUBJECT_PREFIX}.>"], storage=StorageType.FILE,
                          num_replicas=replicas, duplicate_window=DUPLICATE_WINDOW_S, max_age=max_age_s,
                          max_bytes=max_bytes, allow_direct=True)
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            try:
                info = await js.stream_info(stream)
            except NotFoundError:
                info = await js.add_stream(config)
                log.info("created the experience stream %s (%d replicas)", stream, replicas)
            if info.config.num_replicas != replicas:
                log.warning("experience stream %s has %s replicas, not the %d asked for (kept as it is)", stream,
                            info.config.num_replicas, replicas)
            return info
        except Exception as exc:  # noqa: BLE001 - no leader yet, a timeout, a reconnect: retried until the deadline
            last = exc
            await asyncio.sleep(0.2)
    raise ExperienceStreamError(f"experience stream {stream}: not available after {timeout_s:g} s: {last!r}")
