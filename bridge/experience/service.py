"""`tether.v1.Experience.Subscribe`: replay from the log's files, then live, with ack-window back-pressure.

    server = grpc.aio.server()
    experience_pb2_grpc.add_ExperienceServicer_to_server(ExperienceService(log), server)

A subscriber's transitions are always read from the segment files (in a worker thread), never
from the writer's memory: a slow or gone subscriber holds no log resources, so it can neither
block the writer or the event loop nor lose anything; it resumes from its last `next_offset`.
Only durable transitions (offset < `log.durable_offset`) are ever sent. A batch stops after about
`max_batch_bytes` (2 MB) of transitions, so it fits a client's default 4 MB receive limit unless one
transition alone is bigger (a 1080p frame is 6 MB: give such clients a 64 MB limit, as the gateway has).

The plain class under the servicer, for tests and in-process use:

    sub = Subscription(log, experience_pb2.SubscribeStart(from_offset=0, window=1024))
    async for batch in sub.batches():   # stops sending while `window` transitions are unacked
        ...
        sub.ack(batch.next_offset)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import grpc

from bridge.experience.reader import LogCursor
from bridge.experience.segment import SegmentError
from bridge.experience.shards import shard_of
from protos import experience_pb2, experience_pb2_grpc

DEFAULT_WINDOW = 4096
DEFAULT_MAX_BATCH = 256
MAX_WINDOW = 1 << 20
MAX_BATCH = 65536
_READERS = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="experience-read")


class DurableLog(Protocol):
    """What a subscription needs from the log: where its files are and how far they are durable."""

    directory: object

    @property
    def durable_offset(self) -> int: ...

    async def wait_durable(self, offset: int, timeout: float | None = None) -> int: ...


class SubscribeError(ValueError):
    """A bad SubscribeRequest; `field` names the offending field (mapped to INVALID_ARGUMENT)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class Subscription:
    """One subscriber's position, filter and in-flight window (see module docstring)."""

    def __init__(self, log: DurableLog, start: experience_pb2.SubscribeStart, *, max_batch_bytes: int = 2 << 20,
                 idle_poll_s: float = 1.0):
        if start.num_shards > 1 and start.shard >= start.num_shards:
            raise SubscribeError("start.shard", f"{start.shard} is not below num_shards {start.num_shards}")
        if start.num_shards <= 1 and start.shard != 0:
            raise SubscribeError("start.shard", f"{start.shard} given without num_shards > 1")
        if start.window > MAX_WINDOW:
            raise SubscribeError("start.window", f"{start.window} is above {MAX_WINDOW}")
        if start.max_batch > MAX_BATCH:
            raise SubscribeError("start.max_batch", f"{start.max_batch} is above {MAX_BATCH}")
        self.log = log
        self.window = start.window or DEFAULT_WINDOW
        self.max_batch = min(start.max_batch or DEFAULT_MAX_BATCH, self.window)
        self.shard, self.num_shards, self.policy = start.shard, start.num_shards, start.policy
        self.max_batch_bytes, self.idle_poll_s = max_batch_bytes, idle_poll_s
        self.cursor = LogCursor(log.directory, start.from_offset)
        self.sent_through = start.from_offset   # every offset below this has been sent or skipped
        self.acked_through = start.from_offset
        self._inflight: deque[int] = deque()    # offsets sent and not acknowledged
        self._wake = asyncio.Event()            # an ack or a failure
        self._reading: concurrent.futures.Future | None = None
        self.error: SubscribeError | None = None
        self.sent = 0
        self.credit_waits = 0  # times it stopped at a full window (sends nothing more until an ack)
        self._told = time.monotonic()  # when the subscriber last got a batch

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def ack(self, through_offset: int) -> None:
        """Everything with offset < through_offset is consumed; frees that much of the window."""
        if through_offset > self.sent_through:
            raise SubscribeError("ack.through_offset",
                                 f"{through_offset} is beyond what was sent (next_offset {self.sent_through})")
        self.acked_through = max(self.acked_through, through_offset)
        while self._inflight and self._inflight[0] < through_offset:
            self._inflight.popleft()
        self._wake.set()

    def fail(self, error: SubscribeError) -> None:
        """Ends the subscription: the pending or next `next_batch` raises `error`."""
        self.error = error
        self._wake.set()

    def _keep(self, t: experience_pb2.Transition) -> bool:
        if self.policy and t.policy != self.policy:
            return False
        return self.num_shards <= 1 or shard_of(t.session, self.num_shards) == self.shard

    async def _wait_durable_or_wake(self) -> None:
        self._wake.clear()
        waiters = [asyncio.ensure_future(self.log.wait_durable(self.cursor.next_offset, timeout=self.idle_poll_s)),
                   asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    async def next_batch(self) -> experience_pb2.ExperienceBatch:
        """Waits for credit and durable transitions; returns the next non-empty batch."""
        while True:
            if self.error is not None:
                raise self.error
            if self.inflight >= self.window:
                self._wake.clear()
                self.credit_waits += 1
                await self._wake.wait()
                continue
            durable = self.log.durable_offset
            if self.cursor.next_offset >= durable:
                await self._wait_durable_or_wake()
                continue
            credit = min(self.window - self.inflight, self.max_batch)
            self._reading = _READERS.submit(self._read_batch, credit, durable)
            batch = await asyncio.wrap_future(self._reading)
            self._reading = None
            self.sent_through = self.cursor.next_offset
            now = time.monotonic()
            if batch.transitions or now - self._told >= self.idle_poll_s:  # an empty batch still says
                self._told = now                                              # how far the shard is read
                self._inflight.extend(t.offset for t in batch.transitions)
                self.sent += len(batch.transitions)
                batch.log_end = self.log.durable_offset
                return batch

    def _read_batch(self, credit: int, durable: int) -> experience_pb2.ExperienceBatch:
        """In a reader thread: parses the records straight into the batch (one copy less)."""
        batch = experience_pb2.ExperienceBatch()
        self.cursor.read(max_count=credit, end_offset=durable, max_bytes=self.max_batch_bytes, keep=self._keep,
                         out=batch.transitions)
        batch.next_offset = self.cursor.next_offset
        return batch

    async def batches(self) -> AsyncIterator[experience_pb2.ExperienceBatch]:
        try:
            while True:
                yield await self.next_batch()
        finally:
            self.close()

    def close(self) -> None:
        """Releases the file; a read still running in its thread closes it when it ends."""
        reading = self._reading
        if reading is not None and not reading.done():
            reading.add_done_callback(lambda _: self.cursor.close())
        else:
            self.cursor.close()


class ExperienceService(experience_pb2_grpc.ExperienceServicer):
    """The gRPC edge: reads acks in a task, streams a `Subscription`'s batches, maps errors to codes."""

    def __init__(self, log: DurableLog, *, max_batch_bytes: int = 2 << 20,
                 authorize: Callable[[grpc.aio.ServicerContext], Awaitable[object]] | None = None):
        """`authorize(context)` raises (an error with a grpc `status`) for a caller who may not read the log."""
        self.log, self.max_batch_bytes, self._authorize = log, max_batch_bytes, authorize
        self.subscriptions: set[Subscription] = set()   # the live ones (observable by tests and status)

    @property
    def subscribers(self) -> int:
        return len(self.subscriptions)

    async def Subscribe(self, request_iterator, context):  # noqa: N802 - gRPC's method name
        if self._authorize is not None:
            try:
                await self._authorize(context)
            except Exception as exc:
                if getattr(exc, "status", None) is None:
                    raise
                await context.abort(exc.status, str(exc))
            await context.send_initial_metadata((("tether-subscriber", "authorized"),))  # before any data exists
        first = await _first(request_iterator)
        if first is None or first.WhichOneof("kind") != "start":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "start: the first SubscribeRequest must be a start")
        try:
            sub = Subscription(self.log, first.start, max_batch_bytes=self.max_batch_bytes)
        except SubscribeError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

        async def read_acks() -> None:
            try:
                async for req in request_iterator:
                    if req.WhichOneof("kind") != "ack":
                        raise SubscribeError("start", "sent twice: only acks may follow the start")
                    sub.ack(req.ack.through_offset)
            except SubscribeError as e:
                sub.fail(e)

        acks = asyncio.create_task(read_acks())
        self.subscriptions.add(sub)
        try:
            while True:
                await context.write(await sub.next_batch())
        except SubscribeError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except SegmentError as e:  # a damaged file under a running log: say which, do not guess
            await context.abort(grpc.StatusCode.DATA_LOSS, str(e))
        finally:
            self.subscriptions.discard(sub)
            acks.cancel()
            with contextlib.suppress(BaseException):
                await acks
            sub.close()


async def _first(request_iterator):
    async for req in request_iterator:
        return req
    return None
