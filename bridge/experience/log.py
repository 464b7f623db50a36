"""The durable experience log: transitions appended from the event loop, written and fsynced by
one writer thread in group commits, acknowledged only once on disk.

    log = ExperienceLog(directory, segment_bytes=256 << 20, fsync_interval_s=0.005)
    await log.start()                      # recovery: torn tails cut, segments finished
    fut = log.append(transition)           # assigns transition.offset; None = duplicate (dropped)
    if fut is not None:
        offset = await fut                 # resolves once fsynced (never blocks the loop on disk)
    log.last_step("robot-1")               # highest step appended for a session (survives restarts)
    log.durable_step("robot-1")            # highest step of it fsynced (what `durable_through` reports)
    await log.close()                      # flush, fsync, finish the open segment

The log owns a transition once it is appended: do not change it afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from bridge.experience.segment import (
    SegmentWriter,
    list_segments,
    repair_segment,
    scan_segment,
    segment_name,
)
from protos import experience_pb2


class LogError(RuntimeError):
    """The log cannot accept transitions (not started, closed, or its writer failed)."""


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


def _lock(directory: Path) -> int:
    """An exclusive lock on `directory/.lock` (released on close, or by the kernel when the process dies)."""
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LogError(f"{directory}: another experience log is writing here (its .lock is held)") from None
    return fd


class ExperienceLog:
    """Appends `tether.v1.Transition`s to MCAP segments in `directory` (see module docstring).

    A segment is finished and a new one started when its data would pass `segment_bytes` (the
    summary adds about 5 kB) or it is `segment_seconds` old. At most one fsync per
    `fsync_interval_s`: a record waits at most that long plus one write and fsync to be acknowledged,
    and everything appended meanwhile shares the fsync. fsync=False acknowledges after the write
    (the OS page cache: survives a killed process, not a power loss).
    """

    def __init__(self, directory: str | Path, *, segment_bytes: int = 256 << 20, segment_seconds: float = 600.0,
                 fsync_interval_s: float = 0.005, fsync: bool = True):
        if segment_bytes < 4096:
            raise ValueError(f"segment_bytes: {segment_bytes} is below 4096")
        if not segment_seconds > 0:
            raise ValueError(f"segment_seconds: {segment_seconds} must be > 0")
        if not 0 <= fsync_interval_s <= 10:
            raise ValueError(f"fsync_interval_s: {fsync_interval_s} must be within [0, 10]")
        self.directory = Path(directory)
        self.segment_bytes, self.segment_seconds = segment_bytes, segment_seconds
        self.fsync_interval_s, self.fsync = fsync_interval_s, fsync
        self._last_step: dict[str, int] = {}     # highest step appended per session (the event loop's)
        self._durable_step: dict[str, int] = {}  # highest step acknowledged (fsynced) per session
        self._next_offset = 0
        self._durable_offset = 0
        self._cond = threading.Condition()
        self._queue: deque[tuple[experience_pb2.Transition, int, asyncio.Future | None]] = deque()
        self._closing = False
        self._writer_idle = False  # set by the writer before it checks the queue and sleeps
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failed: BaseException | None = None
        self._waiters: list[tuple[int, asyncio.Future]] = []
        self._segment: SegmentWriter | None = None
        self._segment_index = 0
        self._segment_started = 0.0
        self._disk_sessions: dict[str, int] = {}  # last steps written to disk (writer thread)
        self._counts = dict(appended=0, duplicates=0, durable=0, bytes=0, segments=0, fsyncs=0, max_group=0,
                            recovered=0)

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
        """Writes and fsyncs everything appended, finishes the open segment, stops the writer."""
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

    async def __aenter__(self) -> ExperienceLog:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- the hot path (event loop) ---------------------------------------------------------
    def append(self, transition: experience_pb2.Transition) -> asyncio.Future | None:
        """Assigns `transition.offset` and queues it; returns a Future of the offset that resolves once
        it is on disk, or None (and counts it) when its step is not above the session's last one."""
        if self._thread is None or self._closing:
            raise LogError("experience log is not running (call start(), and not after close())")
        if self._failed is not None:
            raise LogError(f"experience log writer failed: {self._failed!r}")
        session, step = transition.session, transition.step
        last = self._last_step.get(session)
        if last is not None and step <= last:
            self._counts["duplicates"] += 1
            return None
        self._last_step[session] = step
        transition.offset = self._next_offset
        self._next_offset += 1
        self._counts["appended"] += 1
        fut = self._loop.create_future()
        self._queue.append((transition, time.time_ns(), fut))  # deque.append is atomic: no lock on the hot path
        if self._writer_idle:
            with self._cond:
                self._cond.notify()
        return fut

    def last_step(self, session: str) -> int | None:
        """The highest step appended for `session` (on disk or queued), None if it has none."""
        return self._last_step.get(session)

    def durable_step(self, session: str) -> int | None:
        """The highest step of `session` that is on disk (fsynced; written with fsync=False): every
        step of it below is too, since a session's steps are appended in order and written in order."""
        return self._durable_step.get(session)

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
                        recovered=c["recovered"])

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

    def _resolve(self, batch: list[tuple[int, asyncio.Future | None, str, int]], durable: int) -> None:
        self._durable_offset = max(self._durable_offset, durable)
        self._counts["durable"] += len(batch)
        steps = self._durable_step
        for offset, fut, session, step in batch:
            if step > steps.get(session, -1):
                steps[session] = step
            if fut is not None and not fut.done():
                fut.set_result(offset)
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
        self._next_offset = self._durable_offset = next_offset
        self._segment_index = segments[-1][0] if segments else 0
        self._counts["segments"] = len(list_segments(self.directory))
        self._counts["recovered"] = recovered

    # -- the writer thread -----------------------------------------------------------------
    def _run(self) -> None:
        last_sync = 0.0
        taken: list = []  # drained from the queue, not yet acknowledged
        try:
            while True:
                with self._cond:
                    self._writer_idle = True
                    while not self._queue and not self._closing:
                        if not self._cond.wait(timeout=self._age_timeout()):
                            break
                    self._writer_idle = False
                    closing = self._closing and not self._queue
                taken = self._drain()
                if taken:
                    self._write(taken)
                    wait = last_sync + self.fsync_interval_s - time.monotonic()
                    if wait > 0 and not self._closing:
                        time.sleep(wait)  # group commit: more appends may queue meanwhile
                        more = self._drain()
                        taken += more
                        self._write(more)
                    if self.fsync and self._segment is not None:
                        self._segment.sync()
                        self._counts["fsyncs"] += 1
                    last_sync = time.monotonic()
                    self._counts["max_group"] = max(self._counts["max_group"], len(taken))
                    done = [(t.offset, fut, t.session, t.step) for t, _, fut in taken]
                    taken = []
                    self._loop.call_soon_threadsafe(self._resolve, done, done[-1][0] + 1)
                if self._segment is not None and self._segment.count and self._segment_aged():
                    self._finish_segment()
                if closing:
                    break
            if self._segment is not None:
                self._finish_segment()
        except BaseException as e:  # noqa: BLE001 - reported to every waiting append and on close
            self._failed = e
            lost = [(t.offset, fut, t.session, t.step) for t, _, fut in taken + self._drain()]
            if self._segment is not None:
                self._segment.abandon()
                self._segment = None
            self._loop.call_soon_threadsafe(self._fail, e, lost)

    def _drain(self) -> list:
        items = []
        with contextlib.suppress(IndexError):
            while True:
                items.append(self._queue.popleft())
        return items

    def _age_timeout(self) -> float | None:
        if self._segment is None or not self._segment.count:
            return None
        return max(0.0, self._segment_started + self.segment_seconds - time.monotonic()) + 0.001

    def _segment_aged(self) -> bool:
        return time.monotonic() - self._segment_started >= self.segment_seconds

    def _write(self, items: list) -> None:
        """Writes queued transitions, rotating segments by size and age (not yet fsynced)."""
        run, run_bytes = [], 0
        for transition, log_time, _fut in items:
            data = transition.SerializeToString()
            size = SegmentWriter.record_size(data)
            seg = self._segment
            if seg is not None and seg.count + len(run) and (
                    seg.size + run_bytes + size > self.segment_bytes or self._segment_aged()):
                self._flush_run(run)
                run, run_bytes = [], 0
                self._finish_segment()
            if self._segment is None:
                self._open_segment(transition.offset)
            run.append((log_time, data))
            run_bytes += size
            if transition.step > self._disk_sessions.get(transition.session, -1):
                self._disk_sessions[transition.session] = transition.step
        self._flush_run(run)

    def _flush_run(self, run: list[tuple[int, bytes]]) -> None:
        if run:
            self._counts["bytes"] += self._segment.append_many(run)

    def _open_segment(self, first_offset: int) -> None:
        self._segment_index += 1
        path = self.directory / segment_name(self._segment_index)
        self._segment = SegmentWriter.create(path, first_offset=first_offset)
        self._segment_started = time.monotonic()
        self._counts["segments"] += 1

    def _finish_segment(self) -> None:
        seg, self._segment = self._segment, None
        seg.finish(dict(self._disk_sessions), fsync=self.fsync)
