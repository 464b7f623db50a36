"""The edge node's line to the gateway: an adapter that turns the one `tether.v1` client
(`bridge.client.SessionThread`: a `Session` over a list of gateway addresses on its own thread)
into events on the control thread's queue, in order:

    LinkUp(generation, welcome, resumed)   a gateway welcomed the session (a new stream: a new
                                     generation); `resumed`: the same session after a failover,
                                     its replay done, so the episode goes on
    LinkReply(generation, message)   the reply (Action | StepError | EpisodeEnd) to an observation sent
    LinkDown(generation, reason, retry_in_s)   the stream broke, or no gateway answered; retrying

`GatewayLink` never blocks its caller: `send` submits an observation on the open stream and returns
False (not sent) while none is open or the generation is stale, so an observation meant for a dead
stream never lands on its successor. What the client does beneath, this module does not repeat:

- failover and Replay: a broken stream (the gateway killed, restarted) is taken over by the session:
  it says Hello to the next address (the same one for a list of one) with the same session id,
  replays as `Replay` the transitions (observation, action, next) the gateway had not acknowledged
  durable (`durable_through`), and resends the step that was in flight. The node drops its own
  flight on LinkDown, so that late reply is not a command (counted in `late_replies`).
  The transitions kept for replay are bounded (`max_unreplayed`, oldest dropped and counted).
- a session that ends (a reply later than `reply_timeout_s`: a hung gateway; a refused Hello) is
  replaced by a new one after a backoff (doubling from `backoff_s[0]` up to `backoff_s[1]`, back to
  the start after a Welcome), until `close()`.

    events = queue.SimpleQueue()
    link = GatewayLink(["10.0.0.5:50051", "10.0.0.6:50051"], hello, events, credentials=Credentials(ca=ca))
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
from collections.abc import Sequence
from dataclasses import dataclass

from bridge.client import Credentials, SessionThread
from protos import bridge_pb2

log = logging.getLogger("tether.edge.link")

__all__ = ["GatewayLink", "LinkDown", "LinkReply", "LinkUp"]


@dataclass(frozen=True)
class LinkUp:
    generation: int
    welcome: bridge_pb2.Welcome
    resumed: bool = False


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
    """Keeps one session with the gateways at `targets` (HOST:PORT, or a list: failover in order)."""

    def __init__(self, targets: str | Sequence[str], hello: bridge_pb2.Hello, events: queue.SimpleQueue, *,
                 connect_timeout_s: float = 2.0, reply_timeout_s: float = 1.0,
                 backoff_s: tuple[float, float] = (0.1, 2.0), credentials: Credentials | None = None,
                 max_unreplayed: int = 10_000):
        self.targets = [targets] if isinstance(targets, str) else list(targets)
        if not self.targets or not all(isinstance(t, str) and t.rpartition(":")[2].isdigit() for t in self.targets):
            raise ValueError(f"targets: expected HOST:PORT addresses, got {targets!r}")
        self.connect_timeout_s = _positive("connect_timeout_s", connect_timeout_s)
        self.reply_timeout_s = _positive("reply_timeout_s", reply_timeout_s)
        if not (isinstance(backoff_s, tuple) and len(backoff_s) == 2
                and all(isinstance(b, int | float) and not isinstance(b, bool) for b in backoff_s)
                and 0 < backoff_s[0] <= backoff_s[1] < math.inf):
            raise ValueError(f"backoff_s: expected (initial, max) with 0 < initial <= max, got {backoff_s!r}")
        if isinstance(max_unreplayed, bool) or not isinstance(max_unreplayed, int) or max_unreplayed < 0:
            raise ValueError(f"max_unreplayed: expected an integer >= 0, got {max_unreplayed!r}")
        self.hello, self.backoff_s = hello, (float(backoff_s[0]), float(backoff_s[1]))
        self.credentials = credentials or Credentials()
        for target in self.targets:
            self.credentials.check(target)
        self.max_unreplayed = max_unreplayed
        self.late_replies = 0           # replies to a step sent on an earlier stream (not commands)
        self.unreplayed_dropped = 0     # transitions dropped from the replay buffer (its bound)
        self._events = events
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._generation = 0
        self._up = False
        self._client: SessionThread | None = None
        self._thread = threading.Thread(target=self._run, name="edge-gateway-link", daemon=True)

    @property
    def session(self):
        """The current `bridge.client.Session` (its `failovers`, `replayed`, `unacked`), or None."""
        client = self._client
        return client.session if client is not None else None

    def start(self) -> None:
        self._thread.start()

    def send(self, message: bridge_pb2.ClientMessage, *, generation: int) -> bool:
        """Submit `message`'s observation on stream `generation`; False (not sent) if that stream is not open.
        Its reply arrives as a LinkReply."""
        with self._lock:
            client = self._client
            if client is None or not self._up or generation != self._generation:
                return False
        future = client.submit(message.observation)
        if future is None:
            return False
        future.add_done_callback(lambda f: self._replied(generation, f))
        return True

    def reset(self, reason: str) -> None:
        """A reply later than the node's limit: the session's own `reply_timeout_s` (the same) ends it and
        a new one is made; nothing to do here but say so."""
        log.warning("gateway %s: %s; the session is replaced", self._address(), reason)

    def close(self, *, grace_s: float = 0.5) -> None:
        """Half-close the stream (the gateway ends it cleanly) and stop; a session stuck waiting for a gateway
        is abandoned after `grace_s` (its thread is a daemon)."""
        self._stop.set()
        client = self._client
        if client is not None:
            client.close(timeout_s=grace_s)
        self._thread.join(timeout=grace_s + 1.0)

    # -- the link's supervising thread --------------------------------------------------------------

    def _address(self) -> str:
        session = self.session
        return session.address if session is not None else self.targets[0]

    def _run(self) -> None:
        delay = self.backoff_s[0]
        while not self._stop.is_set():
            welcomed = threading.Event()      # set: this session had a Welcome, so a later one resumes it

            def up(welcome: bridge_pb2.Welcome, welcomed: threading.Event = welcomed) -> None:
                self._went_up(welcome, resumed=welcomed.is_set())
                welcomed.set()

            client = SessionThread(self.targets, self.hello, credentials=self.credentials,
                                   connect_timeout_s=self.connect_timeout_s, reply_timeout_s=self.reply_timeout_s,
                                   on_up=up,
                                   on_down=lambda why: self._went_down(why, 0.0), name="edge-gateway-session")
            with self._lock:
                self._client = client
            client.start()
            while client.error is None and not self._stop.is_set():
                self._stop.wait(0.05)             # the session keeps itself up; it ends only on an error
            if self._stop.is_set():
                return
            if welcomed.is_set():
                delay = self.backoff_s[0]
            self._went_down(f"session ended: {client.error}", delay)
            client.close(timeout_s=0.5)
            self._stop.wait(delay)
            delay = min(2 * delay, self.backoff_s[1])

    def _went_up(self, welcome: bridge_pb2.Welcome, *, resumed: bool) -> None:
        with self._lock:
            self._generation += 1
            self._up = True
            generation = self._generation
        self._events.put(LinkUp(generation, welcome, resumed))

    def _went_down(self, reason: str, retry_in_s: float) -> None:
        with self._lock:
            self._up = False
            generation = self._generation
        log.warning("gateway %s: %s; reconnecting%s", self._address(), reason,
                    f" in {retry_in_s:.2f} s" if retry_in_s else "")
        self._events.put(LinkDown(generation, reason, retry_in_s))

    def _replied(self, generation: int, future) -> None:
        """On the session's thread: post the reply, and keep the replay buffer within its bound."""
        session = self.session
        if session is not None:
            while len(session.unacked) > self.max_unreplayed:
                session.unacked.popleft()
                self.unreplayed_dropped += 1
        if future.exception() is not None:
            return                                # the session's on_down says why
        with self._lock:
            current = generation == self._generation and self._up
        if not current:
            self.late_replies += 1
            return
        self._events.put(LinkReply(generation, future.result()))
