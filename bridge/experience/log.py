"""The durable experience log: transitions appended from the event loop, written and fsynced by
one writer thread in group commits, acknowledged only once on disk.

    log = ExperienceLog(directory, segment_bytes=256 << 20, fsync_interval_s=0.005)
    await log.start()                      # recovery: torn tails cut, segments finished
    fut = log.append(transition)           # assigns transition.offset; None = duplicate (dropped)
    if fut is not None:
        offset = await fut                 # resolves once fsynced (never blocks the loop on disk)
    log.last_step("robot-1")               # highest step appended for a session (survives restarts)
    log.durable_step("robot-1")            # highest step of it fsynced (what `durable_through` reports)
    log.degraded                           # None, or why the disk refuses writes (the writer retries)
    await log.close()                      # flush, fsync, finish the open segment

The log owns a transition once it is appended: do not change it afterwards.

Disk faults degrade, never abort. When a write, fsync, segment creation or finish fails with an
OSError (ENOSPC, EIO, ...), the writer cuts the open segment back to its last fsynced size (a
half-written record never stays in a segment), keeps every transition it had not made durable,
reports `degraded`, and retries with backoff (`retry_min_s` doubling to `retry_max_s`); when the
disk takes writes again it writes what it kept, in offset order, and `degraded` clears. Meanwhile
`append` goes on accepting (the sessions keep acting) and nothing becomes durable: clients keep their
unacknowledged steps for Replay.

The bound. Transitions accepted but not yet durable are at most `max_pending` (count) and about
`max_pending_bytes` (serialized, as the writer thread measures it: it serializes a transition when
it takes it from the queue, so the event loop never pays for it). At the bound `append` raises `LogFull`, counted in
`stats.refused`, and from then on refuses every later transition of that session too (a session's
steps are logged in order, with no holes) until `resume(session)`, which the gateway calls when the
session connects again: its `durable_through` stays at the first refused step, so its client keeps
that step and everything after, and replays them after the reconnect. The event loop never waits.

Ownership (several gateways, bridge.registry.ownership). With `ownership` (a callable taking the
(session, owner_epoch) pairs of a group commit and returning the stale ones, one query for the whole
group), nothing is acknowledged before ownership confirms it: after the fsync and before any ack, the
writer asks once for the group's pairs (transitions with owner_epoch 0 are not checked). A stale pair
(another gateway claimed the session since) is not acknowledged: its futures fail with `Fenced`, its
session's `durable_step` does not move, it is counted in `stats.fenced`, and `on_fenced(session, epoch)`
is called on the event loop (the gateway ends that session). The records stay in the segment, stamped
with their stale epoch: readers merging gateways' logs drop them (bridge.experience.merge). When the
store cannot be reached, the group is written but not acknowledged (`durable_step` waits: a later
group of the same epoch confirmed current also covers it, epochs only grow).

Retention (`retention_bytes`, `retention_s`; off by default): finished segments are deleted,
oldest first, while all segments together exceed `retention_bytes` or when a segment's last write
is older than `retention_s`. The open segment and the newest finished one (which carries every
session's last step) are never deleted. Counted in `stats.pruned`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bridge.common.files import fsync_dir
from bridge.common.lifecycle import AsyncStarted
from bridge.experience.segment import (
    SegmentWriter,
    is_finished,
    list_segments,
    repair_segment,
    scan_segment,
    segment_name,
)
from bridge.experience.steps import SessionSteps
from protos import experience_pb2

log = logging.getLogger("tether.experience")
_RUN_BYTES = 8 << 20  # the most one writev carries


class LogError(RuntimeError):
    """The log cannot accept transitions (not started, closed, or its writer failed)."""


class Fenced(LogError):
    """Not acknowledged: the session's ownership moved to another gateway (a newer epoch) before the ack."""


class LogFull(LogError):
    """The log holds as many transitions not yet on disk as it may (`max_pending`, `max_pending_bytes`),
    or the session already had one refused (until `resume`): this one is not logged."""


@dataclass(frozen=True)
class LogStats:
    appended: int            # accepted (offsets assigned) since start
    duplicates: int          # dropped: step <= last_step(session)
    durable: int             # acknowledged (fsynced) since start
    pending: int             # accepted, not yet durable
    bytes: int               # message bytes written since start
    segments: int            # segment files in the directory
    fsyncs: int
    max_group: int           # most transitions made durable by one fsync
    next_offset: int
    durable_offset: int
    recovered: int           # transitions found on disk at start
    refused: int = 0         # not accepted: at the bound, or their session past a refused one (LogFull)
    write_errors: int = 0    # failed writes/fsyncs (each retried)
    pruned: int = 0          # segments deleted by retention
    pruned_bytes: int = 0
    pending_bytes: int = 0   # serialized size of the transitions not yet durable
    degraded: str = ""       # why the disk refuses writes now ("" = it does not)
    fenced: int = 0          # written but not acknowledged: their session's ownership epoch was stale
    unconfirmed: int = 0     # written but not acknowledged: the ownership store did not answer


def _lock(directory: Path) -> int:
    """An exclusive lock on `directory/.lock` (released on close, or by the kernel when the process dies)."""
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogError(f"{directory}: another experience log is writing here (its .lock is held)") from None
    return fd


def _describe(error: OSError) -> str:
    name = errno.errorcode.get(error.errno or 0, "") if error.errno else ""
    return f"{name}: {error.strerror or error}" if name else str(error)


class ExperienceLog(SessionSteps, AsyncStarted):
    """Appends `tether.v1.Transition`s to MCAP segments in `directory` (see module docstring).

    A segment is finished and a new one started when its data would pass `segment_bytes` (the
    summary adds about 5 kB) or it is `segment_seconds` old. At most one fsync per
    `fsync_interval_s`: a record waits at most that long plus one write and fsync to be acknowledged,
    and everything appended meanwhile shares the fsync. fsync=False acknowledges after the write
    (the OS page cache: survives a killed process, not a power loss).
    """

    def __init__(self, directory: str | Path, *, segment_bytes: int = 256 << 20, segment_seconds: float = 600.0,
                 fsync_interval_s: float = 0.005, fsync: bool = True, max_pending: int = 100_000,
                 max_pending_bytes: int = 1 << 30, retry_min_s: float = 0.05, retry_max_s: float = 5.0,
                 retention_bytes: int | None = None, retention_s: float | None = None,
                 ownership: Callable[[set[tuple[str, int]]], set[tuple[str, int]]] | None = None,
                 on_fenced: Callable[[str, int], None] | None = None):
        if segment_bytes < 4096:
            raise ValueError(f"segment_bytes: {segment_bytes} is below 4096")
        if not segment_seconds > 0:
            raise ValueError(f"segment_seconds: {segment_seconds} must be > 0")
        if not 0 <= fsync_interval_s <= 10:
            raise ValueError(f"fsync_interval_s: {fsync_interval_s} must be within [0, 10]")
        if max_pending < 1 or max_pending_bytes < 1:
            raise ValueError(f"max_pending ({max_pending}) and max_pending_bytes ({max_pending_bytes}) must be >= 1")
        if not 0 < retry_min_s <= retry_max_s:
            raise ValueError(f"retry_min_s ({retry_min_s}) must be > 0 and <= retry_max_s ({retry_max_s})")
        if retention_bytes is not None and retention_bytes < 0:
            raise ValueError(f"retention_bytes: {retention_bytes} must be >= 0 (None = no size limit)")
        if retention_s is not None and not retention_s > 0:
            raise ValueError(f"retention_s: {retention_s} must be > 0 (None = no age limit)")
        self.directory = Path(directory)
        self.segment_bytes, self.segment_seconds = segment_bytes, segment_seconds
        self.fsync_interval_s, self.fsync = fsync_interval_s, fsync
        self.max_pending, self.max_pending_bytes = max_pending, max_pending_bytes
        self.retry_min_s, self.retry_max_s = retry_min_s, retry_max_s
        self.retention_bytes, self.retention_s = retention_bytes, retention_s
        self.ownership, self.on_fenced = ownership, on_fenced  # see "Ownership" in the module docstring
        # the event loop's
        super().__init__()  # durable: fsynced (written, with fsync=False); `degraded`: the writer thread sets it
        self._next_offset = 0
        self._durable_offset = 0
        self._waiters: list[tuple[int, asyncio.Future]] = []
        # shared (deque appends/pops are atomic; the condition wakes the writer)
        self._cond = threading.Condition()
        self._queue: deque[tuple[experience_pb2.Transition, int, asyncio.Future | None]] = deque()
        self._closing = False
        self._writer_idle = False  # set by the writer before it checks the queue and sleeps
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failed: BaseException | None = None
        # the writer thread's
        # (offset, session, step, log_time_ns, serialized, future): taken from the queue, not yet durable
        self._backlog: list[tuple[int, str, int, int, bytes, asyncio.Future | None, int]] = []  # ..., owner_epoch
        self._backlog_bytes = 0        # their serialized size (read by append for the bound)
        self._written = 0              # backlog items written into the open segment since its last sync
        self._needs_rollback = False   # a failed write left the open segment past its last synced size
        self._retry_at = 0.0
        self._backoff = retry_min_s
        self._segment: SegmentWriter | None = None
        self._segment_index = 0
        self._segment_started = 0.0
        self._disk_sessions: dict[str, int] = {}    # last steps written to disk
        self._synced_sessions: dict[str, int] = {}  # last steps made durable
        self._prune_at = 0.0
        self._counts = dict(appended=0, duplicates=0, durable=0, bytes=0, segments=0, fsyncs=0, max_group=0,
                            recovered=0, refused=0, write_errors=0, pruned=0, pruned_bytes=0, fenced=0, unconfirmed=0)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Recovers the directory (in a thread) and starts the writer thread."""
        if self._thread is not None:
            raise LogError("already started")
        self._loop = asyncio.get_running_loop()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock(self.directory)
        try:
            await asyncio.to_thread(self._recover)
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._thread = threading.Thread(target=self._run, name=f"experience-log:{self.directory.name}", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Writes and fsyncs everything appended, finishes the open segment, stops the writer. With the
        disk still refusing writes it tries once more, then gives up on what it could not write (logged)."""
        if self._thread is None:
            return
        with self._cond:
            self._closing = True
            self._cond.notify()
        await asyncio.to_thread(self._thread.join)
        self._thread = None
        os.close(self._lock_fd)  # releases the directory's lock
        if self._failed is not None:
            raise LogError(f"experience log writer failed: {self._failed!r}") from self._failed

    # -- the hot path (event loop) ---------------------------------------------------------
    def append(self, transition: experience_pb2.Transition) -> asyncio.Future | None:
        """Assigns `transition.offset` and queues it; returns a Future of the offset that resolves once
        it is on disk, or None (and counts it) when its step is not above the session's last one.
        Raises LogFull at the bound (see module docstring), LogError when the log is not running."""
        if self._thread is None or self._closing:
            raise LogError("experience log is not running (call start(), and not after close())")
        if self._failed is not None:
            raise LogError(f"experience log writer failed: {self._failed!r}")
        session, step = transition.session, transition.step
        last = self._last_step.get(session)
        if last is not None and step <= last:
            self._counts["duplicates"] += 1
            return None
        if session in self._refusing or (self._next_offset - self._durable_offset >= self.max_pending
                                         or self._backlog_bytes >= self.max_pending_bytes):
            self._counts["refused"] += 1
            first = self._refusing.setdefault(session, step)
            raise LogFull(f"experience log full ({self._next_offset - self._durable_offset} transitions, "
                          f"{self._backlog_bytes} bytes not yet on disk): session {session!r} is not logged "
                          f"from step {first} until it connects again and replays")
        self._last_step[session] = step
        transition.offset = self._next_offset
        self._next_offset += 1
        self._counts["appended"] += 1
        fut = self._loop.create_future()
        self._queue.append((transition, time.time_ns(), fut))  # deque.append is atomic: no lock
        if self._writer_idle:
            with self._cond:
                self._cond.notify()
        return fut

    @property
    def durable_offset(self) -> int:
        """Offsets below this are on disk (and readable from the segment files)."""
        return self._durable_offset

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def stats(self) -> LogStats:
        c = self._counts
        return LogStats(appended=c["appended"], duplicates=c["duplicates"], durable=c["durable"],
                        pending=self._next_offset - self._durable_offset, bytes=c["bytes"],
                        segments=c["segments"], fsyncs=c["fsyncs"], max_group=c["max_group"],
                        next_offset=self._next_offset, durable_offset=self._durable_offset,
                        recovered=c["recovered"], refused=c["refused"], write_errors=c["write_errors"],
                        pruned=c["pruned"], pruned_bytes=c["pruned_bytes"], pending_bytes=self._backlog_bytes,
                        degraded=self._degraded or "", fenced=c["fenced"], unconfirmed=c["unconfirmed"])

    async def wait_durable(self, offset: int, timeout: float | None = None) -> int:
        """Waits until `durable_offset > offset` (or the timeout); returns durable_offset."""
        if self._durable_offset > offset or self._loop is None:
            return self._durable_offset
        fut = self._loop.create_future()
        self._waiters.append((offset, fut))
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(fut), timeout)
        finally:
            if not fut.done():
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove((offset, fut))
        return self._durable_offset

    def _resolve(self, batch: list[tuple[int, asyncio.Future | None, str, int]], durable: int,
                 withheld: dict[int, tuple[str, int, bool]] | None = None) -> None:
        """Acknowledge `batch`; `withheld`: offset -> (session, epoch, stale) of items ownership did not confirm."""
        self._durable_offset = max(self._durable_offset, durable)
        self._counts["durable"] += len(batch)
        steps = self._durable_step
        fenced: set[tuple[str, int]] = set()
        for offset, fut, session, step in batch:
            held = withheld.get(offset) if withheld else None
            if held is not None:
                if held[2]:
                    self._counts["fenced"] += 1
                    fenced.add(held[:2])
                    if fut is not None and not fut.done():
                        fut.set_exception(Fenced(f"session {session!r} step {step}: ownership epoch {held[1]} is "
                                                 f"stale (another gateway claimed the session): not acknowledged"))
                        fut.exception()  # retrieved: a fenced step is expected, not an unhandled error
                else:
                    self._counts["unconfirmed"] += 1
                    if fut is not None and not fut.done():
                        fut.set_result(offset)
                continue
            if step > steps.get(session, -1):
                steps[session] = step
            if fut is not None and not fut.done():
                fut.set_result(offset)
        if fenced and self.on_fenced is not None:
            for session, epoch in sorted(fenced):
                self.on_fenced(session, epoch)
        still = []
        for offset, fut in self._waiters:
            if fut.done():
                continue
            if self._durable_offset > offset:
                fut.set_result(self._durable_offset)
            else:
                still.append((offset, fut))
        self._waiters = still

    def _fail(self, error: BaseException, batch: list[tuple[int, asyncio.Future | None, str, int]]) -> None:
        for _, fut, _, _ in batch:
            if fut is not None and not fut.done():
                fut.set_exception(LogError(f"experience log writer failed: {error!r}"))
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(LogError(f"experience log writer failed: {error!r}"))
        self._waiters = []

    # -- recovery (a thread, before the writer starts) -------------------------------------
    def _recover(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        sessions: dict[str, int] = {}
        next_offset, recovered = 0, 0
        segments = list_segments(self.directory)
        for _index, path in segments:
            scan = scan_segment(path)
            for s, step in scan.sessions.items():
                if step > sessions.get(s, -1):
                    sessions[s] = step
            if not scan.finished:
                repair_segment(scan, dict(sessions))
            if scan.first_offset is not None and scan.count:
                next_offset = max(next_offset, scan.end_offset)
                recovered += scan.count
        self._last_step = dict(sessions)
        self._durable_step = dict(sessions)
        self._disk_sessions = dict(sessions)
        self._synced_sessions = dict(sessions)
        self._next_offset = self._durable_offset = next_offset
        self._segment_index = segments[-1][0] if segments else 0
        self._counts["segments"] = len(list_segments(self.directory))
        self._counts["recovered"] = recovered

    # -- the writer thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            last_sync = 0.0
            while True:
                with self._cond:
                    self._writer_idle = True
                    while not (self._closing or self._queue or (self._degraded is not None and self._retry_due())):
                        if not self._cond.wait(timeout=self._wait_timeout()):
                            break
                    self._writer_idle = False
                    closing = self._closing
                self._take()
                if (self._backlog or self._degraded is not None) and (self._retry_due() or closing):
                    wait = 0.0 if closing else last_sync + self.fsync_interval_s - time.monotonic()
                    if self._commit(group_wait=wait):
                        last_sync = time.monotonic()
                if self._degraded is None and self._segment is not None and self._segment.count \
                        and self._segment_aged() and not self._backlog:
                    self._guarded(self._finish_segment)
                if self._degraded is None and self._prune_due():
                    self._guarded(self._prune)
                if closing and (not self._queue or self._degraded is not None):
                    break
            if self._backlog and self._degraded is None:
                self._commit(group_wait=0.0)
            if self._degraded is None and self._segment is not None:
                self._guarded(self._finish_segment)
            if self._backlog or self._degraded is not None:
                self._give_up()
        except BaseException as e:  # noqa: BLE001 - a bug, not a disk fault: reported to every waiting append
            self._failed = e
            self._degraded = f"writer failed: {e!r}"
            log.exception("experience log %s: the writer failed", self.directory)
            self._give_up(e)

    def _give_up(self, error: BaseException | None = None) -> None:
        self._take()
        lost, self._backlog, self._backlog_bytes = self._backlog, [], 0
        if lost:
            log.error("experience log %s: %d transitions (offsets %d..%d) were not written: %s", self.directory,
                      len(lost), lost[0][0], lost[-1][0], self._degraded or error)
        if self._segment is not None:
            with contextlib.suppress(OSError):
                if self._needs_rollback:
                    self._segment.rollback()
            self._segment.abandon()
            self._segment = None
        error = error or LogError(f"closed while the disk refused writes: {self._degraded}")
        self._loop.call_soon_threadsafe(self._fail, error, [self._done_item(i) for i in lost])

    @staticmethod
    def _done_item(item) -> tuple[int, asyncio.Future | None, str, int]:
        offset, session, step, _, _, fut, _ = item
        return offset, fut, session, step

    def _retry_due(self) -> bool:
        return self._degraded is None or time.monotonic() >= self._retry_at

    def _wait_timeout(self) -> float | None:
        waits = []
        if self._degraded is not None:
            waits.append(self._retry_at - time.monotonic())
        if self._segment is not None and self._segment.count:
            waits.append(self._segment_started + self.segment_seconds - time.monotonic())
        if self.retention_bytes is not None or self.retention_s is not None:
            waits.append(self._prune_at - time.monotonic())
        return max(0.0, min(waits)) + 0.001 if waits else None

    def _prune_due(self) -> bool:
        return (self.retention_bytes is not None or self.retention_s is not None) and time.monotonic() >= self._prune_at

    def _commit(self, *, group_wait: float) -> bool:
        """Writes the backlog, waits out the group-commit interval (more may queue), fsyncs, and
        acknowledges. On an OSError: degraded, the segment cut back, a retry scheduled; returns False."""
        try:
            if self._needs_rollback:
                self._segment.rollback()
                self._needs_rollback = False
            self._write_backlog()
            if group_wait > 0 and self._degraded is None:
                time.sleep(group_wait)  # group commit: more appends may queue meanwhile
                self._take()
                self._write_backlog()
            if self._segment is not None and self._written:
                if self.fsync:
                    self._segment.sync()
                    self._counts["fsyncs"] += 1
                self._segment.mark_synced()
            acked = len(self._backlog)
        except OSError as e:
            self._on_error(e)
            return False
        if self._degraded is not None:  # cleared before the acks: whoever sees them durable sees it clear
            log.warning("experience log %s: the disk takes writes again (was: %s); writing resumed", self.directory,
                        self._degraded)
            self._degraded = None
            if acked:
                self._backoff = self.retry_min_s
        self._counts["max_group"] = max(self._counts["max_group"], acked)
        self._ack(acked)
        return True

    def _guarded(self, fn) -> None:
        try:
            fn()
        except OSError as e:
            self._on_error(e)

    def _on_error(self, error: OSError) -> None:
        self._counts["write_errors"] += 1
        first = self._degraded is None
        self._degraded = (f"{_describe(error)} (writing {self.directory}; {len(self._backlog)} transitions kept, "
                          f"retrying every {self._backoff:.2g} s)")
        if first:
            log.error("experience log %s: %s: logging degraded, sessions go on, nothing becomes durable until "
                      "the disk takes writes again", self.directory, _describe(error))
        if self._segment is not None:
            self._needs_rollback = True
            with contextlib.suppress(OSError):
                self._segment.rollback()  # cut what the failed write may have left (retried first if this fails)
                self._needs_rollback = False
        self._written = 0
        self._disk_sessions = dict(self._synced_sessions)
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.retry_max_s)

    def _ack(self, n: int) -> None:
        """The first n backlog items are on disk: acknowledge them on the event loop."""
        if n <= 0:
            return
        done, self._backlog = self._backlog[:n], self._backlog[n:]
        self._written = max(0, self._written - n)
        synced = self._synced_sessions
        for _, session, step, _, data, _, _ in done:
            self._backlog_bytes -= len(data)
            if step > synced.get(session, -1):
                synced[session] = step
        self._loop.call_soon_threadsafe(self._resolve, [self._done_item(i) for i in done], done[-1][0] + 1,
                                        self._unconfirmed(done))

    def _unconfirmed(self, done) -> dict[int, tuple[str, int, bool]] | None:
        """Ownership's answer for a group about to be acknowledged (one query): offset -> (session, epoch, stale)
        for the items it does not confirm; None when it confirms all (or there is no ownership check)."""
        if self.ownership is None:
            return None
        pairs = {(item[1], item[6]) for item in done if item[6]}
        if not pairs:
            return None
        try:
            stale, unknown = self.ownership(pairs), False
        except Exception as exc:  # noqa: BLE001 - the store is down: nothing is acknowledged, the writer goes on
            stale, unknown = pairs, True
            log.warning("experience log %s: ownership not confirmed for %d sessions (%s): written, not acknowledged",
                        self.directory, len(pairs), exc)
        if not stale:
            return None
        return {item[0]: (item[1], item[6], not unknown) for item in done if (item[1], item[6]) in stale}

    def _take(self) -> None:
        """Moves what the queue holds to the backlog, serialized (here, off the event loop)."""
        with contextlib.suppress(IndexError):
            while True:
                t, log_time, fut = self._queue.popleft()
                data = t.SerializeToString()
                self._backlog.append((t.offset, t.session, t.step, log_time, data, fut, t.owner_epoch))
                self._backlog_bytes += len(data)

    def _segment_aged(self) -> bool:
        return time.monotonic() - self._segment_started >= self.segment_seconds

    def _write_backlog(self) -> None:
        """Writes the backlog items not yet in the open segment, rotating segments by size and age;
        items in a segment that is finished (fsynced) here are acknowledged. Not yet fsynced."""
        run, run_bytes = [], 0
        i = self._written
        while i < len(self._backlog):
            offset, session, step, log_time, data, _fut, _epoch = self._backlog[i]
            size = SegmentWriter.record_size(data)
            seg = self._segment
            if run_bytes >= _RUN_BYTES:  # one writev at a time: a failing retry stops at the first
                self._flush_run(run)
                run, run_bytes = [], 0
                seg = self._segment
            if seg is not None and seg.count + len(run) and (
                    seg.size + run_bytes + size > self.segment_bytes or self._segment_aged()):
                self._flush_run(run)
                run, run_bytes = [], 0
                self._written = i
                self._finish_segment()
                self._ack(self._written)  # durable in the finished segment
                i = 0
                continue
            if self._segment is None:
                self._open_segment(offset)
            run.append((log_time, data))
            run_bytes += size
            if step > self._disk_sessions.get(session, -1):
                self._disk_sessions[session] = step
            i += 1
        self._flush_run(run)
        self._written = len(self._backlog)

    def _flush_run(self, run: list[tuple[int, bytes]]) -> None:
        if run:
            self._counts["bytes"] += self._segment.append_many(run)

    def _open_segment(self, first_offset: int) -> None:
        index = self._segment_index + 1
        path = self.directory / segment_name(index)
        try:
            self._segment = SegmentWriter.create(path, first_offset=first_offset)
        finally:
            if self._segment is not None or path.exists():
                self._segment_index = index  # created, or a remnant (recovery removes it) that keeps its name
        self._segment_started = time.monotonic()
        self._counts["segments"] += 1

    def _finish_segment(self) -> None:
        """Finishes the open segment (fsynced); on an OSError it stays open, to be cut back and retried."""
        self._segment.finish(dict(self._disk_sessions), fsync=self.fsync)
        self._segment = None
        self._prune_at = 0.0  # retention looks again (from the writer's loop: an error there loses nothing)

    def _prune(self) -> None:
        """Retention: deletes finished segments, oldest first (see module docstring)."""
        if self.retention_bytes is None and self.retention_s is None:
            return
        self._prune_at = time.monotonic() + min(60.0, self.retention_s / 10 if self.retention_s else 60.0)
        segments = list_segments(self.directory)
        open_path = self._segment.path if self._segment is not None else None
        sizes = {}
        for _, p in segments:
            with contextlib.suppress(FileNotFoundError):
                sizes[p] = p.stat()
        total = sum(st.st_size for st in sizes.values())
        finished = [p for _, p in segments if p != open_path and p in sizes and is_finished(p)]
        removed = 0
        for p in finished[:-1]:  # the newest finished segment carries every session's last step: kept
            st = sizes[p]
            too_big = self.retention_bytes is not None and total > self.retention_bytes
            too_old = self.retention_s is not None and time.time() - st.st_mtime > self.retention_s
            if not (too_big or too_old):
                if self.retention_s is None:
                    break  # by size only: the rest is newer and fits
                continue
            p.unlink()
            total -= st.st_size
            removed += 1
            self._counts["pruned"] += 1
            self._counts["pruned_bytes"] += st.st_size
            self._counts["segments"] -= 1
        if removed:
            fsync_dir(self.directory)
            log.info("experience log %s: retention deleted %d segments (%d bytes now)", self.directory, removed,
                     total)
