"""The archiver: the JetStream experience stream into the MCAP segments the gateway's local log writes,
so `tether log`, behaviour cloning (`LogDataset`) and Foxglove read the archive as they read a log.

    archiver = Archiver("nats://127.0.0.1:4222", Path("runs/archive"))
    await archiver.run(until_caught_up=True)   # everything the stream has now, then return
    await archiver.run(stop=event)             # follow the stream until `event` is set (`tether archive`)
    archiver.archived, archiver.next_offset    # transitions written; the stream sequence - 1 to write next

It reads with its own durable pull consumer (`tether-archive` by default; one archiver per consumer
name) and acknowledges a message only after the segment holding it is fsynced, so a killed archiver
loses nothing: at start it finishes the segment it left open and makes its consumer again from the
sequence after the last one its segments hold, so what was delivered and not yet written comes again at
once, and what the segments already hold (offset < next_offset) is skipped. Offsets are the stream's
sequence - 1 (written into each transition's `offset`), so the segments are the stream, message for
message. A sequence the stream no longer holds (its limits deleted it) is a gap: the segment is finished
and the next starts at the following offset. The directory is locked (`.lock`) as a gateway's log directory is.

A message that is not a transition of the session its subject names (`jetstream.transition_of`: an
undecodable body, a hostile or foreign msg id) is not archived: it is counted (`poisoned`), terminated
(`msg.term()`: never delivered again) and leaves a gap in the offsets as a deleted one does. `auth`: the
NATS credentials (a secured cluster's `archiver` user; `--nats-user/--nats-password-file/--nats-ca`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path

from bridge.experience.jetstream import (
    STREAM,
    ExperienceStreamError,
    NatsAuth,
    PoisonedMessage,
    add_nats_arguments,
    connect,
    ensure_stream,
    nats_auth_from,
    parse_servers,
    transition_of,
)
from bridge.experience.log import _lock
from bridge.experience.segment import SegmentWriter, list_segments, repair_segment, scan_segment, segment_name

log = logging.getLogger("tether.experience")

__all__ = ["Archiver"]


class Archiver:
    """The stream's transitions into `directory`'s segments (see the module docstring)."""

    def __init__(self, servers: str, directory: str | Path, *, stream: str = STREAM, durable: str = "tether-archive",
                 batch: int = 1000, segment_bytes: int = 256 << 20, segment_seconds: float = 600.0,
                 ack_wait_s: float = 30.0, auth: NatsAuth | None = None):
        if batch < 1 or segment_bytes < 4096 or not segment_seconds > 0:
            raise ValueError(f"batch ({batch}) must be >= 1, segment_bytes ({segment_bytes}) >= 4096, "
                             f"segment_seconds ({segment_seconds}) > 0")
        self.servers = parse_servers(servers)
        self.directory = Path(directory)
        self.stream, self.durable, self.batch = stream, durable, batch
        self.segment_bytes, self.segment_seconds, self.ack_wait_s = segment_bytes, segment_seconds, ack_wait_s
        self.archived = 0          # transitions written (fsynced) by this run
        self.skipped = 0           # delivered again, already in the segments: acknowledged, not written
        self.gaps = 0              # sequences the stream no longer had
        self.poisoned = 0          # messages that are not a transition of their subject's session: terminated
        self.auth = auth or NatsAuth()
        self.next_offset = 0
        self._sessions: dict[str, int] = {}
        self._segment: SegmentWriter | None = None
        self._index = 0
        self._opened_at = 0.0

    # -- the segments ------------------------------------------------------------------------
    def _recover(self) -> None:
        """Finish a segment a killed archiver left open; learn the next offset and every session's last step."""
        for index, path in list_segments(self.directory):
            scan = scan_segment(path)
            for s, step in scan.sessions.items():
                self._sessions[s] = max(step, self._sessions.get(s, -1))
            if not scan.finished:
                repair_segment(scan, dict(self._sessions))
            if scan.first_offset is not None and scan.count:
                self.next_offset = max(self.next_offset, scan.end_offset)
            self._index = index

    def _write(self, records: list[tuple[int, bytes]], first_offset: int) -> None:
        """Writes records with consecutive offsets from `first_offset` (a new segment on a gap, by size or age),
        then fsyncs. Runs in a thread."""
        if self._segment is not None and (first_offset != self.next_offset or self._full()):
            self._finish()
        if self._segment is None:
            self._index += 1
            self._segment = SegmentWriter.create(self.directory / segment_name(self._index), first_offset=first_offset)
            self._opened_at = time.monotonic()
        self._segment.append_many(records)
        self._segment.sync()
        self._segment.mark_synced()
        self.next_offset = first_offset + len(records)

    def _skip_to(self, offset: int) -> None:
        """Poisoned messages end the batch: finish the open segment (the next one starts after the gap)."""
        self._finish()
        self.next_offset = offset

    def _full(self) -> bool:
        return self._segment.size >= self.segment_bytes or time.monotonic() - self._opened_at >= self.segment_seconds

    def _finish(self) -> None:
        if self._segment is not None:
            self._segment.finish(dict(self._sessions))
            self._segment = None

    # -- the stream --------------------------------------------------------------------------
    async def run(self, *, until_caught_up: bool = False, stop: asyncio.Event | None = None,
                  idle_s: float = 1.0) -> int:
        """Archive until `stop` is set, or (`until_caught_up`) until the stream's last message at the start, or
        a later one, is written and nothing more comes for `idle_s`. Returns the transitions written."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
        from nats.js.errors import NotFoundError

        self.directory.mkdir(parents=True, exist_ok=True)
        lock = _lock(self.directory)
        nc = None
        try:
            await asyncio.to_thread(self._recover)
            nc = await connect(self.servers, name=f"tether-archive {self.directory}", auth=self.auth)
            js = nc.jetstream(timeout=10.0)
            config = ConsumerConfig(durable_name=self.durable, ack_policy=AckPolicy.EXPLICIT,
                                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.next_offset + 1,
                                    ack_wait=self.ack_wait_s, max_ack_pending=max(4 * self.batch, 10_000))

            async def subscribe():
                info = await ensure_stream(js, stream=self.stream, replicas=3 if len(self.servers) >= 3 else 1,
                                           create=not self.auth.user)
                # the segments say where to go on: the consumer is made again from there (a killed archiver's
                # delivered, unacknowledged messages come at once, not after the ack wait)
                with contextlib.suppress(NotFoundError):
                    await js.delete_consumer(self.stream, self.durable)
                return info.state.last_seq, await js.pull_subscribe("", durable=self.durable, stream=self.stream,
                                                                    config=config)

            last_seq, sub = await _while_electing(subscribe, f"archive {self.directory}")
            idle_since = time.monotonic()
            while not (stop is not None and stop.is_set()):
                try:
                    msgs = await sub.fetch(self.batch, timeout=0.5)
                except TimeoutError:
                    msgs = []
                except Exception as exc:  # noqa: BLE001 - a leader change, a reconnect: fetch again
                    log.info("archive %s: fetch failed (%r), again", self.directory, exc)
                    await asyncio.sleep(0.2)
                    continue
                if msgs:
                    idle_since = time.monotonic()
                    await self._take(js, msgs, NotFoundError)
                elif until_caught_up and self.next_offset >= last_seq and time.monotonic() - idle_since >= idle_s:
                    break
            return self.archived
        finally:
            await asyncio.to_thread(self._finish)
            if nc is not None:
                try:
                    await asyncio.wait_for(nc.drain(), 5.0)  # bounded: the servers may all be gone
                except Exception:  # noqa: BLE001 - closing anyway
                    await nc.close()
            os.close(lock)

    async def _take(self, js, msgs, not_found) -> None:
        """Writes a fetched batch (fsynced), then acknowledges it."""
        records: list[tuple[int, bytes]] = []
        first = expected = self.next_offset
        done, later, poisoned = [], [], []
        for msg in sorted(msgs, key=lambda m: m.metadata.sequence.stream):
            offset = msg.metadata.sequence.stream - 1
            if offset < expected:
                self.skipped += 1  # in the segments already (delivered again)
                done.append(msg)
                continue
            if offset > expected:
                if await self._held(js, expected + 1, not_found):
                    later.append(msg)  # the stream still has the missing one: it comes again first
                    continue
                if records:  # the missing ones are gone from the stream: the next segment starts here
                    await asyncio.to_thread(self._write, records, first)
                    self.archived += len(records)
                    records = []
                self.gaps += 1
                log.warning("archive %s: offsets %d..%d are no longer in the stream (its limits)", self.directory,
                            expected, offset - 1)
                first = expected = offset
            try:
                t = transition_of(msg.subject, msg.data, msg.headers)
            except PoisonedMessage as exc:  # not archived: a gap, as a deleted message is
                self.poisoned += 1
                if self.poisoned == 1 or self.poisoned % 1000 == 0:
                    log.warning("archive %s: %d poisoned message(s) terminated, not archived; offset %d: %s",
                                self.directory, self.poisoned, offset, exc)
                if records:
                    await asyncio.to_thread(self._write, records, first)
                    self.archived += len(records)
                    records = []
                poisoned.append(msg)
                first = expected = offset + 1
                continue
            t.offset = offset
            self._sessions[t.session] = max(t.step, self._sessions.get(t.session, -1))
            stamp = int(msg.metadata.timestamp.timestamp() * 1e9) if msg.metadata.timestamp else time.time_ns()
            records.append((stamp, t.SerializeToString()))
            done.append(msg)
            expected += 1
        if records:
            await asyncio.to_thread(self._write, records, first)
            self.archived += len(records)
        if poisoned and not records and self.next_offset < expected:  # the segments go on after the gap
            await asyncio.to_thread(self._skip_to, expected)
        for msg in poisoned:
            await msg.term()
        for msg in done:
            await msg.ack()
        for msg in later:
            await msg.nak()
        if later:
            await asyncio.sleep(0.2)  # the missing ones come back at their ack wait: do not spin on the later ones

    async def _held(self, js, seq: int, not_found) -> bool:
        """Whether the stream still holds sequence `seq`."""
        try:
            await js.get_msg(self.stream, seq)
            return True
        except not_found:
            return False


def parser():
    """`tether archive`'s flags."""
    import argparse

    p = argparse.ArgumentParser(prog="tether archive", description="Write the JetStream experience stream into MCAP "
                                "segments (the local log's format: `tether log`, BC and Foxglove read them). Follows "
                                "the stream until Ctrl-C; a restart resumes where it left off (its durable consumer).")
    p.add_argument("--experience", required=True, metavar="nats://HOST:PORT[,nats://HOST:PORT...]",
                   help="the NATS servers of the experience stream (as `tether gateway --experience`)")
    p.add_argument("--out", required=True, type=Path, help="the archive directory (segments; locked while written)")
    add_nats_arguments(p)
    p.add_argument("--stream", default=STREAM, help="the JetStream stream")
    p.add_argument("--durable", default="tether-archive", help="the archiver's durable consumer (one per archive)")
    p.add_argument("--batch", type=int, default=1000, help="messages fetched, written and fsynced at once")
    p.add_argument("--segment-mb", type=float, default=256.0, help="start a new segment past this size")
    p.add_argument("--segment-seconds", type=float, default=600.0, help="... or this age")
    p.add_argument("--until-caught-up", action="store_true",
                   help="exit once everything the stream held at the start is archived and it is quiet for a second")
    return p


def main(argv: list[str] | None = None) -> int:
    """`tether archive --experience nats://... --out DIR`: prints a JSON summary when it stops."""
    import json
    import signal

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        archiver = Archiver(args.experience, args.out, stream=args.stream, durable=args.durable, batch=args.batch,
                            segment_bytes=int(args.segment_mb * (1 << 20)), segment_seconds=args.segment_seconds,
                            auth=nats_auth_from(args))
    except ValueError as exc:
        raise SystemExit(f"tether archive: {exc}") from None

    async def go() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await archiver.run(until_caught_up=args.until_caught_up, stop=stop)

    try:
        asyncio.run(go())
    except ExperienceStreamError as exc:
        raise SystemExit(f"tether archive: {exc}") from None
    print(json.dumps({"archived": archiver.archived, "skipped": archiver.skipped, "gaps": archiver.gaps,
                      "poisoned": archiver.poisoned,
                      "next_offset": archiver.next_offset, "out": str(args.out)}), flush=True)
    return 0


ELECTION_S = 60.0  # how long JetStream's API may go unanswered (a killed leader's successor being elected)


async def _while_electing(call, what: str):
    """`await call()`, again while JetStream's API times out or says it is unavailable (the stream's or the meta
    leader was just killed and the survivors are electing one), for up to ELECTION_S."""
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import ServiceUnavailableError

    deadline = time.monotonic() + ELECTION_S
    while True:
        try:
            return await call()
        except (NatsTimeout, ServiceUnavailableError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise
            log.info("%s: JetStream's API did not answer (%r): again", what, exc)
            await asyncio.sleep(0.5)
