"""Where the trainer's transitions come from (Acme-style roles): the live stream or the log files.

`StreamSource` is a `tether.v1.Experience.Subscribe` client: it reads from an offset (the
gateway replays its log, then goes live), only this rank's shard of sessions, acknowledges what
was consumed, and reconnects with backoff where it left off. The call loop (needs a gateway):

    source = StreamSource("127.0.0.1:50051", shard=rank, num_shards=world_size, policy="pendulum")
    while training:
        batch = source.poll(timeout=0.5)          # transitions, possibly none
        ...
        source.ack(batch[-1].offset + 1)          # consumed: the gateway may send more
    source.close()

`LogDataset` reads the MCAP segments of a log directory directly (each message a serialized
`tether.v1.Transition`), shuffles with a seeded generator and shards across ranks:

    >>> import tempfile
    >>> from protos import codec, experience_pb2
    >>> d = tempfile.mkdtemp()
    >>> def t(i, value=0.0):
    ...     return experience_pb2.Transition(offset=i, observation=[codec.encode("obs", np.zeros(2, np.float32))],
    ...                                      action=[codec.encode("action", np.full(1, value, np.float32))])
    >>> write_transitions(f"{d}/seg-0.mcap", [t(i) for i in range(10)] + [t(10, float("nan"))])
    >>> ds = LogDataset(d, rank=1, world_size=2, seed=0)
    >>> len(ds), [len(b) for b in ds.batches(2, epoch=0)], ds.skipped
    (10, [2, 2, 1], 1)

Both skip and count a transition they cannot learn from (`protos.codec.transition_problem`: a tensor
that does not decode, NaN/inf, a non-finite reward; for `LogDataset` also tensors shaped unlike the
log's first usable transition) instead of crashing on it: `source.skipped`, `dataset.skipped`, and a
warning naming the first problem.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import grpc
import numpy as np

from bridge.client import Credentials, ExperienceClient
from bridge.common.lifecycle import Closing
from bridge.experience.lerobot import is_lerobot_dataset, iter_lerobot  # pyarrow and PyAV only when one is read
from protos import codec, experience_pb2
from protos.codec import TRANSITION_TENSORS, Spec, transition_problem
from trainer.inbox import Inbox

__all__ = ["LogDataset", "Source", "StreamError", "StreamSource", "TRANSITION_SCHEMA", "misfit", "read_segment",
           "write_transitions"]

log = logging.getLogger(__name__)

TRANSITION_SCHEMA = "tether.v1.Transition"
_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
              grpc.StatusCode.ABORTED, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
              grpc.StatusCode.RESOURCE_EXHAUSTED}


class StreamError(RuntimeError):
    """The gateway refused the subscription (a non-retryable status, e.g. an unknown policy)."""


class Source(Closing):
    """What both live sources share (`StreamSource`, `trainer.nats_source.JetStreamSource`): their shard and window
    checks, the inbox their thread fills, the error it stopped on, and skipping (and counting) what cannot be
    learned from. `what` names the source in the log ("experience stream HOST:PORT")."""

    def __init__(self, what: str, *, shard: int, num_shards: int, window: int, max_batch: int,
                 expect: Sequence[Spec]):
        if num_shards < 1 or not 0 <= shard < num_shards:
            raise ValueError(f"shard {shard} must be in [0, num_shards={num_shards})")
        if window < 1 or max_batch < 1:
            raise ValueError(f"window ({window}) and max_batch ({max_batch}) must be >= 1")
        self._what, self._expect = what, {s.name: s for s in expect}
        self.reconnects = 0
        self.skipped = 0  # transitions received that cannot be learned from (`_learnable`): never polled
        self._resume = 0  # the offset after the last message received
        self._inbox: Inbox = Inbox()
        self._error: BaseException | None = None
        self._closed = threading.Event()

    @property
    def next_offset(self) -> int:
        """Where a new subscription would resume: after the last batch received."""
        return self._resume

    def _take(self, timeout: float, max_items: int | None) -> list:
        if self._error is not None:
            raise self._error
        return self._inbox.take(timeout=timeout, max_items=max_items)

    def _learnable(self, t: experience_pb2.Transition) -> bool:
        problem = transition_problem(t) or misfit(t, self._expect)
        if problem is None:
            return True
        self.skipped += 1
        if self.skipped == 1 or self.skipped % 1000 == 0:
            logging.getLogger(type(self).__module__).warning(
                "%s: skipped %d unusable transition(s); offset %d: %s", self._what, self.skipped, t.offset, problem)
        return False


class StreamSource(Source):
    """`Experience.Subscribe` for one rank: poll transitions, ack them, reconnect on failure.

    `from_offset`: first transition wanted; `window`: unacknowledged transitions the gateway may
    send ahead; `shard`/`num_shards`: this rank's sessions; `policy`: only this policy's
    transitions (empty = all). Reconnects resume at the batch after the last one received. `expect`:
    specs (the policy's inputs and outputs) a transition's tensors of the same name must fit; a transition
    that does not, or cannot be learned from (`transition_problem`), is skipped and counted (`skipped`).
    """

    def __init__(self, address: str, *, from_offset: int = 0, window: int = 4096, max_batch: int = 256,
                 shard: int = 0, num_shards: int = 1, policy: str = "",
                 backoff_s: tuple[float, float] = (0.05, 2.0), expect: Sequence[Spec] = ()):
        if not address or ":" not in address:
            raise ValueError(f"gateway address {address!r} must be HOST:PORT")
        if from_offset < 0:
            raise ValueError(f"from_offset must be >= 0, got {from_offset}")
        super().__init__(f"experience stream {address}", shard=shard, num_shards=num_shards, window=window,
                         max_batch=max_batch, expect=expect)
        if not 0 < backoff_s[0] <= backoff_s[1]:
            raise ValueError(f"backoff_s {backoff_s} must be (initial, max) with 0 < initial <= max")
        self.address = address
        self._start = dict(window=window, max_batch=max_batch, shard=shard, num_shards=num_shards, policy=policy)
        self._backoff = backoff_s
        self._resume = self._acked = from_offset
        self.log_end = 0
        self._requests: queue.Queue | None = None
        self._call = None
        self._lock = threading.Lock()
        self._client = ExperienceClient(address, Credentials.from_env())
        self._thread = threading.Thread(target=self._run, name=f"stream-{address}", daemon=True)
        self._thread.start()

    def poll(self, *, timeout: float = 0.0, max_items: int | None = None) -> list[experience_pb2.Transition]:
        """Transitions received so far (waits up to `timeout` s for the first); [] when none came."""
        items = self._take(timeout, max_items)
        if self._error is not None and not items:
            raise self._error
        return items

    def ack(self, through_offset: int) -> None:
        """Everything with offset < `through_offset` is consumed (the gateway may send more)."""
        with self._lock:
            if through_offset <= self._acked:
                return
            self._acked = through_offset
            if self._requests is not None:
                self._requests.put(experience_pb2.SubscribeRequest(
                    ack=experience_pb2.SubscribeAck(through_offset=through_offset)))

    def commit(self) -> int:
        """`JetStreamSource` compatibility: nothing (the gateway's log keeps everything; `ack` is flow control)."""
        return 0

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self._requests is not None:
                self._requests.put(None)
            if self._call is not None:
                self._call.cancel()
        self._thread.join(timeout=5)
        self._client.close()

    def _run(self) -> None:
        delay = self._backoff[0]
        while not self._closed.is_set():
            requests: queue.Queue = queue.Queue()
            start = experience_pb2.SubscribeStart(from_offset=self._resume, **self._start)
            requests.put(experience_pb2.SubscribeRequest(start=start))
            with self._lock:
                self._requests = requests
                self._call = call = self._client.subscribe(_drain(requests))
            try:
                for batch in call:
                    self.log_end = batch.log_end
                    usable = [t for t in batch.transitions if self._learnable(t)]
                    if usable:
                        self._inbox.put(usable)
                    self._resume = max(self._resume, batch.next_offset)
                    delay = self._backoff[0]
            except grpc.RpcError as e:
                if self._closed.is_set():
                    break
                if e.code() not in _RETRYABLE:
                    self._error = StreamError(f"Experience.Subscribe at {self.address}: {e.code().name}: "
                                              f"{e.details()}")
                    break
                log.info("experience stream %s: %s, reconnecting in %.2f s", self.address, e.code().name, delay)
            finally:
                requests.put(None)
                with self._lock:
                    self._requests = None
            if self._closed.wait(delay):
                break
            delay = min(2 * delay, self._backoff[1])
            self.reconnects += 1


def _drain(requests: queue.Queue) -> Iterator[experience_pb2.SubscribeRequest]:
    while (item := requests.get()) is not None:
        yield item


def write_transitions(path: str | Path, transitions: Iterable[experience_pb2.Transition], *,
                      topic: str = "/tether/transitions") -> None:
    """An MCAP file of `transitions` with the protobuf schema (for tests and exports)."""
    from mcap.writer import Writer

    from bridge.experience.segment import file_descriptor_set

    with open(path, "wb") as f:
        writer = Writer(f)
        writer.start(profile="", library="tether")
        schema = writer.register_schema(TRANSITION_SCHEMA, "protobuf", file_descriptor_set())
        channel = writer.register_channel(topic, "protobuf", schema)
        for t in transitions:
            stamp = t.timing.gateway_recv_ns or 0
            writer.add_message(channel, log_time=stamp, publish_time=stamp, data=t.SerializeToString(),
                               sequence=t.offset & 0xFFFFFFFF)
        writer.finish()


def read_segment(path: str | Path, *, on_skip=None) -> list[experience_pb2.Transition]:
    """The complete `tether.v1.Transition` messages of one MCAP file, in file order.

    A segment still being written (or torn) is read up to its last complete record. A complete message
    that does not parse as a Transition is skipped: `on_skip(why)` (and a warning), then reading goes on.
    """
    from google.protobuf.message import DecodeError
    from mcap.exceptions import McapError
    from mcap.records import Channel, Message, Schema
    from mcap.stream_reader import StreamReader

    schemas: dict[int, str] = {}
    channels: set[int] = set()
    out: list[experience_pb2.Transition] = []
    with open(path, "rb") as f:
        try:
            for record in StreamReader(f, record_size_limit=1 << 30).records:
                if isinstance(record, Schema):
                    schemas[record.id] = record.name
                elif isinstance(record, Channel):
                    if schemas.get(record.schema_id) == TRANSITION_SCHEMA:
                        channels.add(record.id)
                elif isinstance(record, Message) and record.channel_id in channels:
                    try:
                        out.append(experience_pb2.Transition.FromString(record.data))
                    except DecodeError as e:
                        why = f"{path}: message {record.sequence} is not a tether.v1.Transition ({e})"
                        log.warning("%s", why)
                        if on_skip is not None:
                            on_skip(why)
        except (McapError, EOFError, ValueError, OSError) as e:  # an unfinished tail: keep what is complete
            log.debug("%s: stopped at an incomplete record (%s)", path, e)
        except Exception as e:  # zstd/lz4 errors on a torn chunk, struct errors on a torn header
            log.debug("%s: stopped at an unreadable record (%s: %s)", path, type(e).__name__, e)
    return out


def misfit(t: experience_pb2.Transition, expect: dict[str, Spec]) -> str | None:
    """Why a tensor of `t` does not fit the spec of the same name in `expect` (a policy's inputs and outputs by
    name), or None: such a transition cannot be learned from by that policy."""
    for group in TRANSITION_TENSORS if expect else ():
        for x in getattr(t, group):
            spec = expect.get(x.name)
            if spec is not None and (codec.dtype_to_numpy(x.dtype) != spec.dtype or tuple(x.shape) != spec.shape):
                return f"{group}.{x.name}: {list(x.shape)}, the policy's spec is {spec.dtype.name}{list(spec.shape)}"
    return None


def _misshapen(t: experience_pb2.Transition, shapes: dict) -> str | None:
    """Why `t`'s tensors do not stack with the first usable transition's (a name's dtype or shape differs)."""
    for group in ("observation", "action"):  # the same tensor names as the first (applied_action may be absent)
        names = shapes.setdefault((group, ""), sorted(x.name for x in getattr(t, group)))
        if names != sorted(x.name for x in getattr(t, group)):
            return f"{group}: tensors {sorted(x.name for x in getattr(t, group))}, the log's first has {names}"
    for group in TRANSITION_TENSORS:
        for x in getattr(t, group):
            seen = shapes.setdefault((group, x.name), (x.dtype, tuple(x.shape)))
            if seen != (x.dtype, tuple(x.shape)):
                return f"{group}.{x.name}: shape {list(x.shape)} / dtype {x.dtype}, the log's first has " \
                       f"{list(seen[1])} / {seen[0]}"
    return None


class LogDataset:
    """The transitions in the `*.mcap` segments under `log_dir`, shuffled and sharded per epoch. `log_dir` may be a
    LeRobotDataset v3.0 folder instead (bridge.experience.lerobot.iter_lerobot: its frames as Transitions, camera
    frames decoded from its videos; `segments` are then its data files).

    Every rank sees the same number of samples per epoch (the remainder is left out), so all
    ranks take the same number of optimiser steps. `policy` keeps only that policy's transitions.
    """

    def __init__(self, log_dir: str | Path, *, rank: int = 0, world_size: int = 1, seed: int = 0,
                 policy: str | None = None):
        root = Path(log_dir)
        if not root.is_dir():
            raise FileNotFoundError(f"log directory {str(root)!r} does not exist")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} must be in [0, world_size={world_size})")
        self.root, self.rank, self.world_size, self.seed = root, rank, world_size, seed
        by_offset: dict[int, experience_pb2.Transition] = {}
        self.skipped, first_problem = 0, ""
        shapes: dict[tuple[str, str], tuple[int, tuple[int, ...]]] = {}  # (group, tensor) -> the log's dtype, shape

        def undecodable(why: str) -> None:
            nonlocal first_problem
            self.skipped += 1
            first_problem = first_problem or why

        lerobot = is_lerobot_dataset(root)
        if lerobot:  # a LeRobotDataset v3.0 folder: its frames carry no policy, so `policy` does not apply
            segments, policy = sorted((root / "data").glob("*/*.parquet")), None
            batches = iter([(root.name, iter_lerobot(root))])
        else:
            segments = sorted(root.rglob("*.mcap"))
            if not segments:
                raise FileNotFoundError(f"no *.mcap segments (nor a LeRobotDataset's meta/info.json) under "
                                        f"{str(root)!r}")
            batches = ((seg.name, read_segment(seg, on_skip=undecodable)) for seg in segments)  # read in the loop
        for name, transitions in batches:
            for t in transitions:
                if (policy is None or t.policy == policy) and t.offset not in by_offset:
                    problem = transition_problem(t) or _misshapen(t, shapes)
                    if problem is None:
                        by_offset[t.offset] = t
                    else:
                        self.skipped += 1
                        first_problem = first_problem or f"offset {t.offset} in {name}: {problem}"
        if self.skipped:
            log.warning("%s: skipped %d unusable transition(s) (first: %s)", root, self.skipped, first_problem)
        if not by_offset and lerobot:
            raise ValueError(f"no usable frames in the LeRobotDataset {str(root)!r}")
        if not by_offset:
            raise ValueError(f"no tether.v1.Transition messages{f' of policy {policy!r}' if policy else ''} "
                             f"in {len(segments)} segment(s) under {str(root)!r}")
        self.transitions = [by_offset[k] for k in sorted(by_offset)]
        self.segments = segments

    def __len__(self) -> int:
        return len(self.transitions)

    def per_rank(self) -> int:
        """Samples each rank sees per epoch."""
        return len(self.transitions) // self.world_size

    def order(self, epoch: int) -> np.ndarray:
        """This rank's indices for `epoch` (a seeded permutation, strided by rank)."""
        rng = np.random.default_rng([self.seed, epoch])
        perm = rng.permutation(len(self.transitions))
        return perm[self.rank::self.world_size][:self.per_rank()]

    def batches(self, batch_size: int, *, epoch: int, start: int = 0) -> Iterator[list[experience_pb2.Transition]]:
        """This rank's batches of `epoch`, from its `start`-th sample on."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        order = self.order(epoch)
        for i in range(start, len(order), batch_size):
            yield [self.transitions[j] for j in order[i:i + batch_size]]
