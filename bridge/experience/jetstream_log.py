"""The experience log on NATS JetStream: the same `ExperienceSink` as the local MCAP log, acknowledged
only once the replicated stream has a transition.

    log = JetStreamLog("nats://127.0.0.1:4222,nats://127.0.0.1:4223,nats://127.0.0.1:4224")
    await log.start()                      # connects, creates the stream if absent (3 replicas for 3 servers)
    await log.prepare(["robot-1"])         # learns robot-1's last step from the stream (a session moved here)
    fut = log.append(transition)           # None = duplicate (dropped); else resolves once the stream has it
    log.last_step("robot-1"), log.durable_step("robot-1")
    log.degraded                           # None, or why nothing becomes durable now (no leader, disconnected)
    await log.close()                      # waits (bounded) for what is in flight

Publishing is asynchronous with at most `max_inflight` messages awaiting their PubAck. A transition is
durable (`durable_step`, and so the session's `durable_through`) when the stream acknowledged it and
every earlier step of its session. A publish that times out (`ack_timeout_s`), is overtaken (the stream
acknowledges in send order: a PubAck for a later message means an earlier one was lost, e.g. with the
server we were connected to), finds no responders or gets an error (the stream is electing a new
leader) sends every message not yet acknowledged again, in their order, after a backoff (`retry_min_s` doubling to
`retry_max_s`): the stream drops those it already has (their `Nats-Msg-Id` within the duplicate
window), so a retry never doubles a transition.

A PubAck saying "duplicate" is durability only when the stream's message under that msg id is this
transition: the stored message (read back by its sequence) must carry the same subject, msg id, session,
step, episode and observation (a retry of ours, or the same step logged by the gateway the session came
from). Anything else (someone published `<session>:<step>` first, e.g. a forged future step) is counted
(`foreign_duplicates`), never durable, and the transition is sent again every `foreign_retry_s` until the
stream's duplicate window has passed and it is stored: the session's `durable_through` waits meanwhile.
`prepare` trusts only a last message whose msg id carries the session's own prefix and ASCII digits.

The bound is the local log's: transitions accepted and not yet durable are at most `max_pending`
(count) and `max_pending_bytes` (serialized). At the bound `append` raises `LogFull` and refuses the
session's later transitions too until `resume(session)` (its reconnect): its client keeps them and
replays them. A message larger than the connection's max payload raises `LogError` (not logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from bridge.common.lifecycle import AsyncStarted
from bridge.experience.jetstream import (
    STREAM,
    NatsAuth,
    connect,
    ensure_stream,
    headers_of,
    parse_msg_id,
    parse_servers,
    step_of,
    subject_of,
)
from bridge.experience.log import Fenced, LogError, LogFull
from bridge.experience.steps import SessionSteps
from protos import experience_pb2

log = logging.getLogger("tether.experience")

__all__ = ["JetStreamLog", "JetStreamStats"]


@dataclass(frozen=True)
class JetStreamStats:
    """What the gateway's metrics read (the names of `bridge.experience.log.LogStats` where they mean the same)."""

    appended: int          # accepted since start
    duplicates: int        # dropped: step <= last_step(session)
    durable: int           # acknowledged by the stream since start
    pending: int           # accepted, not yet durable (the bound's count)
    pending_bytes: int     # their serialized size
    inflight: int          # published, awaiting the PubAck
    bytes: int             # message bytes acknowledged since start
    refused: int           # LogFull: at the bound, or the session past a refused one
    retries: int           # times the unacknowledged messages were sent again (timeouts, no responders, errors)
    stream_duplicates: int  # PubAcks saying the stream already had the message (a retry of a stored one)
    max_pending: int       # the most transitions pending at once
    max_inflight: int      # the most messages awaiting a PubAck at once
    longest_stall_s: float  # the longest time with transitions pending and none acknowledged
    degraded: str = ""     # why nothing becomes durable now ("" = it does)
    write_errors: int = 0  # = retries (the gauge the local log has)
    pruned: int = 0        # always 0 (the stream's own limits prune)
    fenced: int = 0        # acknowledged by the stream, never durable here: their session's epoch was stale
    overtaken: int = 0     # go-backs because a PubAck came for a message sent after one still unacknowledged
    foreign_duplicates: int = 0  # duplicate PubAcks whose stored message is not this transition: not durable
    untrusted: int = 0     # messages read back (a moved session's last step) with a msg id not the session's own


@dataclass(eq=False)
class _Item:
    n: int                         # append order
    session: str
    step: int
    subject: str
    data: bytes
    headers: dict[str, str]
    future: asyncio.Future
    epoch: int = 0
    acked: bool = False            # the stream has it
    confirmed: bool = False        # ... and ownership confirmed its epoch (or there is no ownership check)
    dropped: bool = False          # fenced: its session moved; never durable here
    checking: bool = False         # a duplicate PubAck: the stored message is being read back
    ack: asyncio.Future | None = field(default=None, repr=False)


class JetStreamLog(SessionSteps, AsyncStarted):
    """Transitions to the JetStream stream `stream` (see the module docstring). `replicas`: the stream's
    replication when this log creates it (default: 3 with 3 or more servers given, else 1)."""

    def __init__(self, servers: str | Sequence[str], *, stream: str = STREAM, replicas: int | None = None,
                 max_inflight: int = 256, max_pending: int = 100_000, max_pending_bytes: int = 1 << 30,
                 ack_timeout_s: float = 2.0, retry_min_s: float = 0.05, retry_max_s: float = 0.5,
                 close_timeout_s: float = 5.0, name: str = "tether-gateway",
                 ownership: Callable[[set[tuple[str, int]]], set[tuple[str, int]]] | None = None,
                 on_fenced: Callable[[str, int], None] | None = None, auth: NatsAuth | None = None,
                 create_stream: bool | None = None, foreign_retry_s: float = 5.0):
        """`ownership`/`on_fenced`: as the local log's (bridge.experience.log, "Ownership"): an acknowledged
        transition is durable only once `ownership` (called in a thread, once per group) confirms its epoch.
        `auth`: the NATS credentials; `create_stream`: create the stream if absent (default: only without a
        user: a secured cluster's admin creates it)."""
        self.servers = parse_servers(servers)
        if max_inflight < 1 or max_pending < 1 or max_pending_bytes < 1:
            raise ValueError(f"max_inflight ({max_inflight}), max_pending ({max_pending}) and max_pending_bytes "
                             f"({max_pending_bytes}) must be >= 1")
        if not 0 < retry_min_s <= retry_max_s:
            raise ValueError(f"retry_min_s ({retry_min_s}) must be > 0 and <= retry_max_s ({retry_max_s})")
        if not ack_timeout_s > 0:
            raise ValueError(f"ack_timeout_s must be > 0, got {ack_timeout_s}")
        self.stream = stream
        self.replicas = replicas if replicas is not None else (3 if len(self.servers) >= 3 else 1)
        self.max_inflight, self.max_pending, self.max_pending_bytes = max_inflight, max_pending, max_pending_bytes
        self.ack_timeout_s, self.retry_min_s, self.retry_max_s = ack_timeout_s, retry_min_s, retry_max_s
        self.close_timeout_s, self.name = close_timeout_s, name
        self.ownership, self.on_fenced = ownership, on_fenced
        self.auth = auth or NatsAuth()
        self.create_stream = not self.auth.user if create_stream is None else create_stream
        self.foreign_retry_s = foreign_retry_s
        self._checks: set[asyncio.Task] = set()
        self._unconfirmed: list[_Item] = []  # acknowledged by the stream, awaiting ownership's answer
        self._confirming = False
        self._nc = self._js = None
        self._task: asyncio.Task | None = None
        self._closing = False
        super().__init__()  # durable: acknowledged by the stream
        self._per_session: dict[str, deque[_Item]] = {}  # not yet durable, in step order
        self._subjects: dict[str, str] = {}              # session -> its subject (escaping once)
        self._queue: deque[_Item] = deque()               # to publish (again), in append order
        self._inflight: dict[int, _Item] = {}             # published, awaiting the PubAck (insertion = send order)
        self._sent_at: dict[int, float] = {}
        self._wake = asyncio.Event()
        self._n = 0
        self._pending = self._pending_bytes = 0
        self._retry_at = 0.0
        self._backoff = retry_min_s
        self._stall_since: float | None = None  # pending and nothing acknowledged since
        self._max_payload = 1 << 20
        self._c = dict(appended=0, duplicates=0, durable=0, bytes=0, refused=0, retries=0, stream_duplicates=0,
                       max_pending=0, max_inflight=0, fenced=0, overtaken=0, foreign_duplicates=0, untrusted=0)
        self._longest_stall = 0.0

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Connects, makes sure the stream exists, starts publishing."""
        if self._task is not None:
            raise LogError("already started")
        self._nc = await connect(self.servers, name=self.name, auth=self.auth)
        self._js = self._nc.jetstream(timeout=self.ack_timeout_s)
        try:
            await ensure_stream(self._js, stream=self.stream, replicas=self.replicas, create=self.create_stream)
        except BaseException:
            await self._nc.close()
            raise
        self._max_payload = self._nc.max_payload or self._max_payload
        self._task = asyncio.create_task(self._pump(), name=f"jetstream-log:{self.stream}")

    async def close(self) -> None:
        """Publishes what is queued (up to `close_timeout_s`), then disconnects; what is still not durable
        fails its future (LogError) and stays with the clients for Replay."""
        if self._task is None:
            return
        self._closing = True
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), self.close_timeout_s)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None
        for check in list(self._checks):  # duplicate PubAcks still being read back: not durable
            check.cancel()
        lost = [i for items in self._per_session.values() for i in items]
        for item in lost:
            if not item.future.done():
                item.future.set_exception(LogError(f"closed before the stream acknowledged {item.session}:"
                                                   f"{item.step}"))
        if lost:
            log.warning("experience stream %s: closed with %d transitions not acknowledged (their clients keep "
                        "them for Replay)", self.stream, len(lost))
        try:
            await asyncio.wait_for(self._nc.drain(), 5.0)  # bounded: the servers may all be gone
        except Exception:  # noqa: BLE001 - closing anyway
            await self._nc.close()

    # -- the ExperienceSink (event loop) ---------------------------------------------------
    def append(self, transition: experience_pb2.Transition) -> asyncio.Future | None:
        """Queues `transition` for the stream; a Future resolving (to the step) once it is durable, or None when
        its step is not above the session's last one. LogFull at the bound; LogError when not running."""
        if self._task is None or self._closing:
            raise LogError("experience stream log is not running (call start(), and not after close())")
        session, step = transition.session, transition.step
        last = self._last_step.get(session)
        if last is not None and step <= last:
            self._c["duplicates"] += 1
            return None
        if session in self._refusing or self._pending >= self.max_pending \
                or self._pending_bytes >= self.max_pending_bytes:
            self._c["refused"] += 1
            first = self._refusing.setdefault(session, step)
            raise LogFull(f"experience stream log full ({self._pending} transitions, {self._pending_bytes} bytes "
                          f"not yet acknowledged by the stream): session {session!r} is not logged from step "
                          f"{first} until it connects again and replays")
        data = transition.SerializeToString()
        if len(data) > self._max_payload - 1024:
            raise LogError(f"transition {session}:{step} is {len(data)} bytes, over the NATS max payload "
                           f"{self._max_payload} (raise max_payload in nats-server's config)")
        epoch = int(getattr(transition, "owner_epoch", 0) or 0)
        self._last_step[session] = step
        future = asyncio.get_running_loop().create_future()
        subject = self._subjects.get(session)
        if subject is None:
            if len(self._subjects) >= 1 << 16:
                self._subjects.clear()  # bounded: ids of sessions long gone
            subject = self._subjects[session] = subject_of(session)
        item = _Item(self._n, session, step, subject, data, headers_of(session, step, epoch), future,
                     epoch)
        self._n += 1
        self._per_session.setdefault(session, deque()).append(item)
        self._queue.append(item)
        self._pending += 1
        self._pending_bytes += len(data)
        self._c["appended"] += 1
        self._c["max_pending"] = max(self._c["max_pending"], self._pending)
        if self._stall_since is None:
            self._stall_since = time.monotonic()
        self._wake.set()
        return future

    async def prepare(self, sessions: Iterable[str]) -> None:
        """Learn each session's last step in the stream (a session that moved here from another gateway, or
        this gateway restarted): its `last_step`/`durable_step` become at least that, so Welcome.next_step
        and Replay's duplicates are right. A session with transitions in flight here is left as it is."""
        from nats.js.errors import NotFoundError

        async def one(session: str) -> None:
            if self._per_session.get(session):
                return
            try:
                msg = await self._js.get_last_msg(self.stream, subject_of(session))
            except NotFoundError:
                return
            except Exception as exc:  # noqa: BLE001 - the stream is unavailable: Replay's msg ids still dedupe
                log.warning("experience stream %s: last step of %s unknown (%r)", self.stream, session, exc)
                return
            step = step_of(msg.headers, session)
            if step is None:  # not this session's own msg id: data from the network, not trusted for a position
                self._c["untrusted"] += 1
                log.warning("experience stream %s: the last message of session %r (sequence %s) has no msg id "
                            "<session>:<step> of its own: ignored", self.stream, session, getattr(msg, "seq", "?"))
                return
            if step > self._last_step.get(session, -1):
                self._last_step[session] = step
            if step > self._durable_step.get(session, -1):
                self._durable_step[session] = step

        names = list(dict.fromkeys(sessions))
        limit = asyncio.Semaphore(64)

        async def bounded(session: str) -> None:
            async with limit:
                await one(session)

        try:  # a Hello waits at most about one request timeout, even while the stream elects a leader
            await asyncio.wait_for(asyncio.gather(*(bounded(s) for s in names)), self.ack_timeout_s + 0.5)
        except TimeoutError:
            log.warning("experience stream %s: last steps of %d sessions not all read in time (the stream "
                        "drops replayed duplicates by msg id anyway)", self.stream, len(names))

    @property
    def stats(self) -> JetStreamStats:
        c = self._c
        stall = self._longest_stall
        if self._stall_since is not None:
            stall = max(stall, time.monotonic() - self._stall_since)
        return JetStreamStats(appended=c["appended"], duplicates=c["duplicates"], durable=c["durable"],
                              pending=self._pending, pending_bytes=self._pending_bytes, inflight=len(self._inflight),
                              bytes=c["bytes"], refused=c["refused"], retries=c["retries"],
                              stream_duplicates=c["stream_duplicates"], max_pending=c["max_pending"],
                              max_inflight=c["max_inflight"], longest_stall_s=stall, degraded=self._degraded or "",
                              write_errors=c["retries"], fenced=c["fenced"], overtaken=c["overtaken"],
                              foreign_duplicates=c["foreign_duplicates"], untrusted=c["untrusted"])

    async def wait_durable(self, timeout: float) -> bool:
        """Waits until nothing is pending (or the timeout); True if nothing is."""
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return not self._pending

    # -- publishing (one task) -------------------------------------------------------------
    async def _pump(self) -> None:
        while not (self._closing and not self._pending):
            now = time.monotonic()
            if now >= self._retry_at:
                await self._send()
            self._wake.clear()
            waits = [self._retry_at - now] if self._queue and self._retry_at > now else []
            if self._inflight:
                oldest = self._sent_at[next(iter(self._inflight))]
                waits.append(oldest + self.ack_timeout_s - time.monotonic())
            timeout = max(0.001, min(waits)) if waits else None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            if self._inflight and time.monotonic() - self._sent_at[next(iter(self._inflight))] >= self.ack_timeout_s:
                for _ in range(3):  # a busy loop may hold PubAcks not yet handed over: let it first
                    await asyncio.sleep(0)
                n = next(iter(self._inflight), None)
                if n is not None and time.monotonic() - self._sent_at[n] >= self.ack_timeout_s:
                    self._go_back(f"no PubAck within {self.ack_timeout_s:g} s (stream leader lost?)")

    async def _send(self) -> None:
        while self._queue and len(self._inflight) < self.max_inflight:
            item = self._queue.popleft()
            if item.acked or item.dropped:
                continue
            retries = self._c["retries"]
            try:
                ack = await self._js.publish_async(item.subject, item.data, headers=item.headers)
            except Exception as exc:  # noqa: BLE001 - reconnecting, buffer full, closed: sent again later
                self._requeue(item)
                self._go_back(f"publish failed: {exc!r}")
                return
            if self._c["retries"] != retries:  # a go-back meanwhile put earlier messages first: this one after them
                ack.cancel()
                self._requeue(item)
                return
            item.ack = ack
            self._inflight[item.n] = item
            self._sent_at[item.n] = time.monotonic()
            self._c["max_inflight"] = max(self._c["max_inflight"], len(self._inflight))
            ack.add_done_callback(lambda f, item=item: self._on_ack(item, f))

    def _on_ack(self, item: _Item, ack: asyncio.Future) -> None:
        error = None if ack.cancelled() else ack.exception()  # retrieved even when the send was given up
        if ack.cancelled() or item.ack is not ack:
            return  # a send given up by _go_back (sent again)
        if error is not None:  # it and everything sent after it: again, in order
            self._go_back(f"publish refused: {error!r}")
            self._wake.set()
            return
        overtaken = next(iter(self._inflight)) != item.n  # PubAcks come in send order: an earlier one was lost
        self._inflight.pop(item.n, None)
        self._sent_at.pop(item.n, None)
        result = ack.result()
        if getattr(result, "duplicate", False):  # durable only if the stream's message is this one: read it back
            self._c["stream_duplicates"] += 1
            item.checking = True
            task = asyncio.get_running_loop().create_task(self._check_duplicate(item, int(result.seq)))
            self._checks.add(task)
            task.add_done_callback(self._checks.discard)
        else:
            self._acked(item)
        if overtaken:
            self._c["overtaken"] += 1
            self._go_back("a PubAck overtook an earlier message (lost on the way: a server or the leader changed)")
        self._wake.set()

    async def _check_duplicate(self, item: _Item, seq: int) -> None:
        """A duplicate PubAck for `item`: acknowledged if the stream's message `seq` is this transition; else not
        durable, sent again after `foreign_retry_s` (stored once the stream's duplicate window has passed)."""
        why, delay = None, self.foreign_retry_s
        try:
            stored = await self._js.get_msg(self.stream, seq)
            if not _same_transition(stored, item):
                self._c["foreign_duplicates"] += 1
                n = self._c["foreign_duplicates"]
                why = (f"the stream holds another message (sequence {seq}) under msg id {item.session}:{item.step}: "
                       f"not durable, sent again every {self.foreign_retry_s:g} s")
                if n == 1 or n % 100 == 0:
                    log.error("experience stream %s: %s (%d such duplicates)", self.stream, why, n)
        except Exception as exc:  # noqa: BLE001 - cannot read it back now: sent again soon, its PubAck checked again
            why = f"a duplicate PubAck for {item.session}:{item.step} could not be checked ({exc!r})"
            delay = self._backoff
            log.warning("experience stream %s: %s; sent again in %.2g s", self.stream, why, delay)
        item.checking = False
        if item.acked or item.dropped:
            return
        if why is None:
            self._acked(item)
        else:
            self._degraded = why
            asyncio.get_running_loop().call_later(delay, self._send_again, item)
        self._wake.set()

    def _send_again(self, item: _Item) -> None:
        if not (item.acked or item.dropped or item.checking) and self._task is not None:
            self._requeue(item)
            self._wake.set()

    def _acked(self, item: _Item) -> None:
        if item.acked:
            return
        item.acked = True
        if self._degraded is not None:
            log.warning("experience stream %s acknowledges again (was: %s)", self.stream, self._degraded)
            self._degraded = None
        self._backoff = self.retry_min_s
        now = time.monotonic()
        if self._stall_since is not None:
            self._longest_stall = max(self._longest_stall, now - self._stall_since)
        self._stall_since = now
        if self.ownership is None or not item.epoch:
            self._confirmed(item)
        elif not item.dropped:
            self._unconfirmed.append(item)
            if not self._confirming:
                self._confirming = True
                asyncio.get_running_loop().create_task(self._confirm())

    async def _confirm(self) -> None:
        """Ownership's answer for the acknowledged, unconfirmed transitions (one query per group, in a thread)."""
        try:
            while self._unconfirmed:
                group, self._unconfirmed = self._unconfirmed, []
                pairs = {(i.session, i.epoch) for i in group}
                try:
                    stale = await asyncio.to_thread(self.ownership, pairs)
                except Exception as exc:  # noqa: BLE001 - the store is down: not durable yet, asked again
                    log.warning("experience stream %s: ownership not confirmed for %d sessions (%r): acknowledged "
                                "by the stream, not durable yet", self.stream, len(pairs), exc)
                    self._unconfirmed[:0] = group
                    await asyncio.sleep(self.retry_max_s)
                    continue
                fenced = set()
                for item in group:
                    if (item.session, item.epoch) in stale:
                        fenced.add((item.session, item.epoch))
                    elif not item.dropped:
                        self._confirmed(item)
                for session, epoch in sorted(fenced):
                    self._fence(session, epoch)
        finally:
            self._confirming = False

    def _fence(self, session: str, epoch: int) -> None:
        """`session` moved to another gateway (its epoch here is stale): none of its pending transitions becomes
        durable here; their futures fail with Fenced; `on_fenced` tells the gateway."""
        items = self._per_session.pop(session, deque())
        for item in items:
            item.dropped = True
            self._pending -= 1
            self._pending_bytes -= len(item.data)
            if not item.future.done():
                item.future.set_exception(Fenced(f"session {session!r} step {item.step}: ownership epoch "
                                                 f"{item.epoch} is stale (another gateway claimed the session)"))
                item.future.exception()  # retrieved: expected, not an unhandled error
        self._c["fenced"] += len(items)
        if self.on_fenced is not None:
            self.on_fenced(session, epoch)

    def _confirmed(self, item: _Item) -> None:
        item.confirmed = True
        items = self._per_session.get(item.session)
        while items and items[0].confirmed:
            done = items.popleft()
            self._durable_step[done.session] = done.step
            self._pending -= 1
            self._pending_bytes -= len(done.data)
            self._c["durable"] += 1
            self._c["bytes"] += len(done.data)
            if not done.future.done():
                done.future.set_result(done.step)
        if items is not None and not items:
            del self._per_session[item.session]
        if not self._pending:
            self._stall_since = None

    def _requeue(self, item: _Item) -> None:
        """`item` back into the queue at its place (append order)."""
        self._queue = deque(sorted([*self._queue, item], key=lambda i: i.n))

    def _go_back(self, why: str) -> None:
        """Every message awaiting its PubAck goes back to the front of the queue, in order, sent again after a
        backoff (the stream drops the ones it has: their msg ids)."""
        back = sorted(self._inflight.values(), key=lambda i: i.n)
        for item in back:
            ack, item.ack = item.ack, None
            if ack is not None and not ack.done():
                ack.cancel()
        self._inflight.clear()
        self._sent_at.clear()
        self._queue.extendleft(reversed(back))
        self._c["retries"] += 1
        if self._degraded is None:
            log.warning("experience stream %s: %s; %d transitions pending, retrying", self.stream, why, self._pending)
        self._degraded = f"{why}; {self._pending} transitions pending, retrying every {self._backoff:.2g} s"
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.retry_max_s)


def _same_transition(stored, item: _Item) -> bool:
    """Whether a message read back from the stream is `item`'s transition: the same bytes, or the same subject,
    msg id, session, step, episode and observation (the step as another gateway logged it before the session
    moved: timings, epoch and version fields may differ)."""
    if stored.subject != item.subject or parse_msg_id((stored.headers or {}).get("Nats-Msg-Id")) != (item.session,
                                                                                                     item.step):
        return False
    if stored.data == item.data:
        return True
    try:
        theirs = experience_pb2.Transition.FromString(stored.data)
    except Exception:  # noqa: BLE001 - undecodable: not ours
        return False
    ours = experience_pb2.Transition.FromString(item.data)
    return (theirs.session, theirs.step, theirs.episode, list(theirs.observation)) == \
        (ours.session, ours.step, ours.episode, list(ours.observation))
