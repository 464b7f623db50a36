"""A trainer's transitions from the JetStream experience stream: a durable pull consumer, acknowledged only
after the checkpoint that used them is written.

    source = JetStreamSource("nats://127.0.0.1:4222", durable="ppo-pendulum-r0", policy="pendulum",
                             shard=rank, num_shards=world_size)
    while training:
        batch = source.poll(timeout=0.5, max_items=4096)   # transitions (offset = stream sequence - 1)
        ... update ...
        checkpoint.save(...)                              # the file holding the update is written
        source.commit()                                   # then the stream may forget what it was made from
    source.close()

Nothing is acknowledged before `commit()`: a trainer killed between a poll and its checkpoint leaves
those messages unacknowledged, and the next trainer with the same durable name gets them again. At the
start an existing consumer with unacknowledged messages is moved back to its ack floor (deleted and
created again from the first unacknowledged sequence), so a restarted trainer gets them at once rather
than after the consumer's ack wait. The consumer acknowledges "all" (an ack covers every earlier
message): `commit()` is one confirmed ack of the last message polled. Each rank has its own consumer
and keeps its shard of sessions (`bridge.experience.shards.shard_of`, as `Experience.Subscribe`);
another shard's transitions are passed over and acknowledged with the rest. `window` bounds what the
stream delivers unacknowledged (the server's `max_ack_pending`): between two commits a rank reads at
most that many; `ack(offset)` is accepted for `StreamSource` compatibility and does nothing.
The PPO and SAC trainers read it with `tether train --experience nats://...` (trainer.loop).

A message that is not a transition of the session its subject names (`bridge.experience.jetstream.
transition_of`: an undecodable body, a msg id that is not `<session>:<ASCII digits>` or names another
session or step) is counted (`poisoned`), logged and passed over like another shard's: the next
`commit()` acknowledges it with the rest (ack-all), so it is never fatal and never delivered for ever
(`msg.term()` is not used: on an ack-all consumer it would also acknowledge the uncheckpointed ones
before it). `auth`: the NATS credentials (a secured cluster's `trainer` user).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence

from bridge.experience.jetstream import (
    STREAM,
    NatsAuth,
    PoisonedMessage,
    connect,
    ensure_stream,
    parse_servers,
    transition_of,
)
from bridge.experience.shards import shard_of
from protos import experience_pb2
from protos.codec import Spec
from trainer.sources import Source

__all__ = ["JetStreamSource"]

log = logging.getLogger(__name__)


class JetStreamSource(Source):
    """Poll transitions from the stream, `commit()` after each checkpoint (see the module docstring)."""

    def __init__(self, servers: str | Sequence[str], *, durable: str, stream: str = STREAM, policy: str = "",
                 shard: int = 0, num_shards: int = 1, window: int = 65536, max_batch: int = 1024,
                 ack_wait_s: float = 3600.0, expect: Sequence[Spec] = (), connect_timeout_s: float = 30.0,
                 auth: NatsAuth | None = None):
        if not durable or any(c in durable for c in ". *>"):
            raise ValueError(f"durable {durable!r} must be a non-empty name without '.', '*', '>' or spaces")
        super().__init__(f"experience consumer {durable}", shard=shard, num_shards=num_shards, window=window,
                         max_batch=max_batch, expect=expect)
        self.servers, self.durable, self.stream = parse_servers(servers), durable, stream
        self.policy, self.shard, self.num_shards = policy, shard, num_shards
        self.window, self.max_batch, self.ack_wait_s = window, max_batch, ack_wait_s
        self.auth = auth or NatsAuth()
        self.poisoned = 0         # messages that are not a transition of their subject's session (passed over)
        self.committed = 0        # messages acknowledged by commit()
        self._polled_last = None  # the last message polled (or passed over): what commit() acknowledges
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"nats-source-{durable}", daemon=True)
        self._thread.start()
        if not self._ready.wait(connect_timeout_s) or self._error is not None:
            self.close()
            raise ConnectionError(f"experience stream at {','.join(self.servers)}: "
                                  f"{self._error or f'not ready after {connect_timeout_s:g} s'}")

    def poll(self, *, timeout: float = 0.0, max_items: int | None = None) -> list[experience_pb2.Transition]:
        """This shard's usable transitions received so far (waits up to `timeout` s for the first batch)."""
        items = self._take(timeout, max_items)  # (the transition, or None where passed over; the message)
        if items:
            self._polled_last = items[-1][1]
        return [t for t, _ in items if t is not None]

    def ack(self, through_offset: int) -> None:
        """`StreamSource` compatibility: nothing (flow control is the consumer's `window`; see `commit`)."""

    def commit(self, timeout: float = 10.0) -> int:
        """Acknowledge every message polled so far (call it after the checkpoint that used them is written);
        returns how many messages that covered. Waits for the server's confirmation."""
        msg = self._polled_last
        if msg is None:
            return 0
        done = asyncio.run_coroutine_threadsafe(msg.ack_sync(timeout=timeout), self._loop)
        done.result(timeout + 1.0)
        covered = msg.metadata.sequence.consumer - self.committed
        self.committed = msg.metadata.sequence.consumer
        self._polled_last = None
        return covered

    def close(self) -> None:
        """Stop fetching; what was not committed is delivered again to the next trainer with this durable."""
        self._closed.set()
        self._thread.join(timeout=10)

    # -- the fetching thread ---------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._fetch())
        except BaseException as exc:  # noqa: BLE001 - reported to poll()
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _fetch(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError

        nc = await connect(self.servers, name=f"tether-trainer {self.durable}", auth=self.auth)
        try:
            js = nc.jetstream(timeout=10.0)
            await ensure_stream(js, stream=self.stream, replicas=3 if len(self.servers) >= 3 else 1,
                                create=not self.auth.user)
            config = ConsumerConfig(durable_name=self.durable, ack_policy=AckPolicy.ALL, ack_wait=self.ack_wait_s,
                                    max_ack_pending=self.window, deliver_policy=DeliverPolicy.ALL)
            try:
                info = await js.consumer_info(self.stream, self.durable)
                if info.num_ack_pending:  # a trainer died before its checkpoint: from its ack floor again, now
                    floor = info.ack_floor.stream_seq if info.ack_floor else 0
                    await js.delete_consumer(self.stream, self.durable)
                    config.deliver_policy, config.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, floor + 1
                    log.info("experience consumer %s: %d unacknowledged messages from sequence %d delivered again",
                             self.durable, info.num_ack_pending, floor + 1)
            except NotFoundError:
                pass
            sub = await js.pull_subscribe("", durable=self.durable, stream=self.stream, config=config)
            self._ready.set()
            while not self._closed.is_set():
                try:
                    msgs = await sub.fetch(self.max_batch, timeout=0.25)
                except TimeoutError:
                    continue
                except Exception as exc:  # noqa: BLE001 - a leader change, a reconnect: fetch again
                    self.reconnects += 1
                    log.info("experience consumer %s: fetch failed (%r), again", self.durable, exc)
                    await asyncio.sleep(0.2)
                    continue
                self._inbox.put([(self._usable(m), m) for m in msgs])
        finally:
            await nc.close()

    def _usable(self, msg) -> experience_pb2.Transition | None:
        """The message's transition if it is this shard's and fit to learn from; else None (passed over)."""
        meta = msg.metadata
        self._resume = max(self._resume, meta.sequence.stream)
        try:
            t = transition_of(msg.subject, msg.data, msg.headers)
        except PoisonedMessage as exc:
            self.poisoned += 1
            if self.poisoned == 1 or self.poisoned % 1000 == 0:
                log.warning("experience consumer %s: passed over %d poisoned message(s); sequence %d: %s",
                            self.durable, self.poisoned, meta.sequence.stream, exc)
            return None
        t.offset = meta.sequence.stream - 1
        if shard_of(t.session, self.num_shards) != self.shard or (self.policy and t.policy != self.policy):
            return None
        return t if self._learnable(t) else None
