"""The edge node's line to the gateway: one `tether.v1.Bridge.Connect` stream, kept up by a thread.

`GatewayLink` never blocks its caller. `send` queues a `ClientMessage` (an observation) on the
open stream (and returns False, dropping it, while none is open); what happens on the stream
arrives as events on the caller's queue, in order:

    LinkUp(generation, welcome)      a stream is open and the gateway welcomed us
    LinkReply(generation, message)   one ServerMessage (Action | StepError | EpisodeEnd)
    LinkDown(generation, reason, retry_in_s)   the stream ended or never opened; retrying

Every stream has its own `generation`; `send(msg, generation=...)` refuses a stale one, so an
observation meant for a dead stream never lands on its successor. After a failure the link
waits `retry_in_s` (doubling from `backoff_s[0]` up to `backoff_s[1]`, back to the start after a
Welcome) and connects again, until `close()`. While nothing answers at all, that wait is spent
listening for the gateway (the channel connects the moment it serves, gRPC retrying at most every
second), so a restarted gateway is reached at once; a gateway that answers and then fails the
stream (refuses the Hello, ends it) is waited for in full.

Threads: the link's own thread connects, reads replies and posts events; gRPC's request thread
consumes the outbox. The caller only calls `send`, `reset` and `close`, from any thread.

    events = queue.SimpleQueue()
    link = GatewayLink("127.0.0.1:50051", hello, events)
    link.start()
    event = events.get()                          # LinkUp(generation=1, welcome=...)
    link.send(ClientMessage(observation=obs), generation=event.generation)
    events.get()                                  # LinkReply(generation=1, message=action)
    link.close()

Settings are checked when the link is made, naming the bad value:

    >>> GatewayLink("127.0.0.1:1", None, queue.SimpleQueue(), backoff_s=(2.0, 1.0))
    Traceback (most recent call last):
    ...
    ValueError: backoff_s: expected (initial, max) with 0 < initial <= max, got (2.0, 1.0)
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from protos import bridge_pb2, bridge_pb2_grpc

log = logging.getLogger("tether.edge.link")

__all__ = ["GatewayLink", "LinkDown", "LinkReply", "LinkUp"]

_UNREACHABLE = "not reachable"
_CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.enable_retries", 0),
                    ("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000)]


@dataclass(frozen=True)
class LinkUp:
    generation: int
    welcome: bridge_pb2.Welcome


@dataclass(frozen=True)
class LinkReply:
    generation: int
    message: bridge_pb2.ServerMessage


@dataclass(frozen=True)
class LinkDown:
    generation: int
    reason: str
    retry_in_s: float


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a finite number of seconds > 0, got {value!r}")
    return float(value)


class GatewayLink:
    """Keeps one Connect stream to `target` (HOST:PORT) open, announcing itself with `hello`."""

    def __init__(self, target: str, hello: bridge_pb2.Hello, events: queue.SimpleQueue, *,
                 connect_timeout_s: float = 2.0, backoff_s: tuple[float, float] = (0.1, 2.0),
                 credentials: grpc.ChannelCredentials | None = None,
                 metadata: tuple[tuple[str, str], ...] | None = None):
        if not isinstance(target, str) or not target.rpartition(":")[2].isdigit():
            raise ValueError(f"target: expected HOST:PORT, got {target!r}")
        self.connect_timeout_s = _positive("connect_timeout_s", connect_timeout_s)
        if not (isinstance(backoff_s, tuple) and len(backoff_s) == 2
                and all(isinstance(b, int | float) and not isinstance(b, bool) for b in backoff_s)
                and 0 < backoff_s[0] <= backoff_s[1] < math.inf):
            raise ValueError(f"backoff_s: expected (initial, max) with 0 < initial <= max, got {backoff_s!r}")
        self.target, self.hello, self.backoff_s = target, hello, (float(backoff_s[0]), float(backoff_s[1]))
        self._credentials = credentials  # TLS (EdgeConfig.credentials()); None = plaintext
        self._metadata = metadata        # on every Connect: the robot token (EdgeConfig.call_metadata())
        self._events = events
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._generation = 0
        self._outbox: queue.SimpleQueue | None = None   # the open stream's, after its Welcome
        self._call: grpc.Call | None = None
        self._thread = threading.Thread(target=self._run, name="edge-gateway-link", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, message: bridge_pb2.ClientMessage, *, generation: int) -> bool:
        """Queue `message` on stream `generation`; False (not sent) if that stream is not open.

        The caller builds the stream's message itself (the node fills the observation in place):
        wrapping an `Observation` here would copy it on the control thread's critical path."""
        with self._lock:
            if self._outbox is None or generation != self._generation:
                return False
            self._outbox.put(message)
            return True

    def reset(self, reason: str) -> None:
        """Abandon the open stream (e.g. a reply that never came); the link reconnects."""
        with self._lock:
            call = self._call
        if call is not None:
            log.warning("resetting the stream to %s: %s", self.target, reason)
            call.cancel()

    def close(self, *, grace_s: float = 0.5) -> None:
        """Half-close the stream (the gateway ends it cleanly), cancel it after `grace_s`, stop."""
        self._stop.set()
        with self._lock:
            if self._outbox is not None:
                self._outbox.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=grace_s)
        with self._lock:
            call = self._call
        if call is not None:
            call.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    # -- the link thread ------------------------------------------------------------------------

    def _run(self) -> None:
        delay, patience = self.backoff_s[0], 0.0
        while not self._stop.is_set():
            with self._lock:
                self._generation += 1
                generation = self._generation
            welcomed, reason = self._stream(generation, patience)
            if self._stop.is_set():
                return
            if welcomed:
                delay = self.backoff_s[0]
            self._events.put(LinkDown(generation, reason, delay))
            log.warning("gateway %s: %s; reconnecting in %.2f s", self.target, reason, delay)
            if reason.startswith(_UNREACHABLE):
                # nothing answered: the next attempt listens for the gateway `delay` longer instead of
                # sleeping, so a gateway that (re)starts meanwhile is connected to at once
                patience = delay
            else:
                patience = 0.0
                self._stop.wait(delay)
            delay = min(2 * delay, self.backoff_s[1])

    def _stream(self, generation: int, patience: float = 0.0) -> tuple[bool, str]:
        """One stream from connect to end: (whether it was welcomed, why it ended). It waits up to
        `connect_timeout_s + patience` for the channel to connect."""
        channel = (grpc.secure_channel(self.target, self._credentials, options=_CHANNEL_OPTIONS)
                   if self._credentials is not None else grpc.insecure_channel(self.target, options=_CHANNEL_OPTIONS))
        outbox: queue.SimpleQueue = queue.SimpleQueue()
        welcomed = False
        try:
            if not self._wait_ready(channel, self.connect_timeout_s + patience):
                return False, f"{_UNREACHABLE} within {self.connect_timeout_s + patience:g} s"
            call = bridge_pb2_grpc.BridgeStub(channel).Connect(_requests(self.hello, outbox), metadata=self._metadata)
            with self._lock:
                self._call = call
            if self._stop.is_set():
                call.cancel()
            late = threading.Event()
            timer = threading.Timer(self.connect_timeout_s, lambda: (late.set(), call.cancel()))
            timer.daemon = True
            timer.start()
            try:
                first = next(call, None)
            except grpc.RpcError:
                if late.is_set():
                    return False, f"no Welcome within {self.connect_timeout_s:g} s"
                raise
            finally:
                timer.cancel()
            if first is None or first.WhichOneof("kind") != "welcome":
                what = "the end of the stream" if first is None else first.WhichOneof("kind")
                return False, f"expected a Welcome, got {what}"
            with self._lock:
                self._outbox = outbox
            welcomed = True
            self._events.put(LinkUp(generation, first.welcome))
            for message in call:
                self._events.put(LinkReply(generation, message))
            return True, f"the gateway ended the stream ({call.code().name})"
        except grpc.RpcError as exc:
            return welcomed, f"{exc.code().name}: {exc.details()}"
        finally:
            with self._lock:
                self._outbox, self._call = None, None
            outbox.put(None)
            channel.close()

    def _wait_ready(self, channel: grpc.Channel, timeout_s: float) -> bool:
        ready = grpc.channel_ready_future(channel)
        deadline = time.monotonic() + timeout_s
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    ready.result(timeout=0.05)
                    return True
                except grpc.FutureTimeoutError:
                    continue
            return False
        finally:
            ready.cancel()


def _requests(hello: bridge_pb2.Hello, outbox: queue.SimpleQueue) -> Iterator[bridge_pb2.ClientMessage]:
    """The request stream: the Hello, then whatever `send` queues, until a None (half-close)."""
    yield bridge_pb2.ClientMessage(hello=hello)
    while (message := outbox.get()) is not None:
        yield message
