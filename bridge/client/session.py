"""One `tether.v1.Bridge.Connect` session over a list of gateways: Hello, steps, durability, Replay,
failover.

    async with Session(["10.0.0.1:50051", "10.0.0.2:50051"], hello, credentials=creds, reconnect_s=30) as s:
        s.welcome                                  # the gateway's Welcome (session id, logging, next_step)
        reply = await s.step(observation)          # ServerMessage: Action | StepError | EpisodeEnd
        ...
    # leaving the block half-closes the stream and checks that it ended OK

A vector session is the same with `hello.batched` and N-row observations.

When the gateway logs experience (`Welcome.logging`), the session keeps every step it sent until a reply
says it is durable (`durable_through`). If the stream breaks (UNAVAILABLE, the gateway gone), the session
moves to the next address of the list (round robin, back to the same one for a list of one), says Hello
with the same session id and resends, as `Replay`, what was not acknowledged durable, then sends the step
again; it keeps trying for `reconnect_s` (0: it raises `ConnectionError` at once). A vectorised session
(`hello.batched`) replays its N-row steps the same way, without `Replay.next` (the next message on the
stream completes a replayed step); the gateway logs each env's transition of a replayed step once. A
replayed `Action` carries the `log_prob` it was answered with, so the logged transition keeps the acting
policy's log-probability.

Across gateways with their own logs, what the first made durable but had not yet acknowledged when it
died is logged again by the second: at-least-once, one (session, step) key, never a lost step
(`failovers` records where each move happened, what was resent and how long it took). Each gateway's
claim on the session id carries an epoch (Welcome.owner_epoch, bridge.registry.ownership): readers
merging the logs keep, per (session, step), the record of the newest epoch (bridge.experience.merge),
and a gateway whose epoch went stale acknowledges nothing more (fencing).

What makes a gateway "gone": its stream ends UNAVAILABLE (a dead process, a refused connection, or a
gateway draining on SIGTERM: `Draining`), or, with several gateways and `reconnect_s` > 0, no reply
within `reply_timeout_s` (a gateway cut off without a TCP reset: the blackholed connection stays open,
only the deadline sees it; gRPC keepalive, `KEEPALIVE_MS`, also ends an idle one). Either way the
session moves on at once. With one gateway a silent one raises TimeoutError, as before.

The robot's clock (`clock`, `time.time_ns` unless given) stamps every Hello and observation and every reply's
arrival; each Welcome and Action is a sample of the gateway's clock, and `offset` (bridge.client.clock) keeps
the minimum-round-trip estimate, sent with every observation (`clock_offset_ns`) so that the gateway states its
times in the robot's clock too. `hops` is the last Action's latency budget, hop by hop, in the robot's clock.

gRPC's own client-side load balancing, and why the failover above stays explicit. A channel to
`ipv4:10.0.0.1:50051,10.0.0.2:50051` (or a DNS name with several records) with `round_robin` and
`healthCheckConfig` (`balanced=True`, `balanced_target`) keeps one subchannel per gateway and watches
each one's gRPC health: a new stream is only started on a READY gateway that says SERVING, so a dead or
draining gateway is skipped without a timed-out Hello. That is used here, for picking: with
`balanced=True` every Hello (the first and each failover) goes through such a channel. What it cannot
do is move a stream: a bidirectional stream is bound to one subchannel for its life, gRPC never
retries or moves it once messages flowed (transparent retries only cover streams that never left the
client), and what the new gateway must be told (the same session id, then the steps not yet durable,
as Replay, in order) is the application's. So the loop that sees the break, re-Hellos and replays is
the same in both modes; only the choice of the next gateway differs (the list's next address, or the
balancer's pick of a healthy one). `Failover.gateway` names where it landed (Welcome.gateway_id).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from bridge.client.channel import Credentials, aio_channel
from bridge.client.clock import ClockOffset, Hops, hops
from protos.tether.v1 import bridge_pb2, bridge_pb2_grpc

__all__ = ["Broken", "Failover", "Session", "SessionError"]

KEEPALIVE_MS = 10_000  # a ping every 10 s (the gateway allows 5 s), 5 s to answer: a dead idle connection ends
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.enable_retries", 0),
                   ("grpc.keepalive_time_ms", KEEPALIVE_MS), ("grpc.keepalive_timeout_ms", 5_000),
                   ("grpc.http2.max_pings_without_data", 0))
SERVICE_NAME = "tether.v1.Bridge"
BALANCED_CONFIG = ('{"loadBalancingConfig": [{"round_robin": {}}], '
                   f'"healthCheckConfig": {{"serviceName": "{SERVICE_NAME}"}}}}')


def balanced_target(addresses: Sequence[str]) -> str:
    """One gRPC target for several gateways: `ipv4:H:P,H:P` (IPv4 literals), `ipv6:[H]:P,...`, or the one
    address as given (a DNS name with several records: `dns:///gw.lab:50051`).

    >>> balanced_target(["127.0.0.1:5001", "127.0.0.1:5002"])
    'ipv4:127.0.0.1:5001,127.0.0.1:5002'
    """
    import ipaddress

    if len(addresses) == 1:
        return addresses[0]
    kinds = set()
    for a in addresses:
        host, _, port = a.rpartition(":")
        try:
            kinds.add(ipaddress.ip_address(host.strip("[]")).version)
        except ValueError:
            raise ValueError(f"balanced: several addresses must be IP literals HOST:PORT (a name: give one "
                             f"dns:/// target with several records), got {a!r}") from None
        if not port.isdigit():
            raise ValueError(f"balanced: {a!r} has no port")
    if len(kinds) != 1:
        raise ValueError(f"balanced: mixed IPv4 and IPv6 addresses {list(addresses)}")
    return f"ipv{kinds.pop()}:" + ",".join(addresses)


class SessionError(RuntimeError):
    """The gateway rejected or ended the session, or broke the protocol; `code` is the gRPC status it
    ended the stream with (None for a protocol break)."""

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None):
        super().__init__(message)
        self.code = code


class Broken(ConnectionError):
    """The stream to the gateway broke (the gateway went away)."""


@dataclass(frozen=True)
class Failover:
    """One move: from `source` to `target`, the lowest step not acknowledged durable, the steps resent."""

    source: str
    target: str
    durable_through: int
    replayed: tuple[int, ...]
    gateway: str = ""        # the new gateway's --gateway-id (Welcome.gateway_id)
    epoch: int = 0           # its claim on the session (Welcome.owner_epoch)
    broken_at: float = 0.0   # time.time() when the break was seen
    seconds: float = 0.0     # from the break seen to the session resumed (Welcome and Replay done)


class Session:
    """The client side of one Connect stream. Not thread-safe: one task drives it (`bridge.client.thread`
    runs it on a thread for blocking callers)."""

    def __init__(self, addresses: str | Sequence[str], hello: bridge_pb2.Hello, *,
                 credentials: Credentials | None = None, connect_timeout_s: float = 10.0,
                 reply_timeout_s: float = 10.0, reconnect_s: float = 0.0,
                 channels: dict[str, grpc.aio.Channel] | None = None,
                 on_up: Callable[[bridge_pb2.Welcome], None] | None = None,
                 on_down: Callable[[str], None] | None = None, balanced: bool = False,
                 clock: Callable[[], int] = time.time_ns):
        self.addresses = [addresses] if isinstance(addresses, str) else list(addresses)
        if not self.addresses or not all(isinstance(a, str) and a for a in self.addresses):
            raise ValueError(f"addresses: expected HOST:PORT strings, got {addresses!r}")
        self.gateways = list(self.addresses)
        self.balanced = balanced
        if balanced:  # one channel over all of them: round_robin among the healthy (see module docstring)
            self.addresses = [balanced_target(self.addresses)]
        if reconnect_s < 0 or connect_timeout_s <= 0 or reply_timeout_s <= 0:
            raise ValueError(f"timeouts must be > 0 and reconnect_s >= 0, got connect_timeout_s={connect_timeout_s} "
                             f"reply_timeout_s={reply_timeout_s} reconnect_s={reconnect_s}")
        credentials = credentials or Credentials()
        for address in self.gateways:
            credentials.check(address)
        self.hello_msg, self.credentials = bridge_pb2.Hello(), credentials
        self.hello_msg.CopyFrom(hello)  # ours: the Welcome's session id is written into it
        self.connect_timeout_s, self.reply_timeout_s, self.reconnect_s = connect_timeout_s, reply_timeout_s, reconnect_s
        self._channels = channels if channels is not None else {}   # shared by the sessions of one runner
        self._own_channels = channels is None
        self._index = 0
        self.call: grpc.aio.StreamStreamCall | None = None
        self.welcome: bridge_pb2.Welcome | None = None
        self.logging = False
        self.unacked: deque[tuple[bridge_pb2.Observation, bridge_pb2.Action | None]] = deque()  # sent, not durable
        self.durable_through = self.reconnects = self.replayed = 0
        self.failovers: list[Failover] = []
        self._broken_at = 0.0  # time.time() of the break being handled (0: none)
        self._on_up, self._on_down = on_up, on_down  # called on every Welcome / broken stream (from the loop)
        self.clock = clock                  # the robot's clock (ns): every t_sent_ns and t_recv is read from it
        self.offset = ClockOffset()         # gateway clock - robot clock, from every Welcome and Action
        self.hops: Hops | None = None       # the last Action's latency budget, robot clock (bridge.client.clock)
        self.received_ns = 0                # robot clock: when the last reply arrived
        self._replied_step = 0

    @property
    def id(self) -> str:
        return self.hello_msg.session_id

    @property
    def address(self) -> str:
        """The gateway the session talks to now."""
        return self.addresses[self._index]

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            options = CHANNEL_OPTIONS + ((("grpc.service_config", BALANCED_CONFIG),) if self.balanced else ())
            self._channels[address] = aio_channel(address, self.credentials, options=options)
        return self._channels[address]

    async def __aenter__(self) -> Session:
        try:
            await self.open()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                await self.close()
        finally:
            await self.aclose()

    # -- the stream ------------------------------------------------------------------------------

    async def open(self) -> bridge_pb2.Welcome:
        """Hello to the first address that welcomes us within `connect_timeout_s` (each tried in turn)."""
        deadline = time.monotonic() + self.connect_timeout_s
        errors = []
        while True:
            attempt = deadline - time.monotonic()
            if len(self.addresses) > 1:  # a dead first address must leave time for the others
                attempt = min(attempt, max(1.0, self.connect_timeout_s / len(self.addresses)))
            try:
                return await self._hello(max(0.05, attempt), wait_for_ready=True)
            except (TimeoutError, Broken) as e:
                errors.append(f"{self.address}: {e}")
                if time.monotonic() >= deadline:
                    raise ConnectionError(f"session {self.id}: no gateway of {self.addresses} welcomed us within "
                                          f"{self.connect_timeout_s:g} s ({'; '.join(errors[-len(self.addresses):])})"
                                          ) from None
                self._index = (self._index + 1) % len(self.addresses)

    async def step(self, observation: bridge_pb2.Observation) -> bridge_pb2.ServerMessage:
        """Send one observation and return the gateway's reply to it, failing over (and replaying) if the
        stream breaks on the way."""
        deadline = None
        while True:
            try:
                observation.clock_offset_ns = self.offset.offset_ns
                if self.hops is not None:  # the previous reply's downlink, for the gateway's latency budget
                    told = observation.client_hops
                    told.step, told.reply_ns = told.step or self._replied_step, told.reply_ns or self.hops.reply
                observation.t_sent_ns = self.clock()
                await self._write(bridge_pb2.ClientMessage(observation=observation))
                msg = await self._read(self.reply_timeout_s, f"reply to step {observation.step}")
                self.received_ns = self.clock()
                break
            except (Broken, TimeoutError) as e:
                if isinstance(e, TimeoutError) and not (self.reconnect_s and len(self.gateways) > 1):
                    raise  # one gateway, silent: the caller decides (the edge's link starts a new session)
                if self._on_down is not None:  # a silent gateway (cut off, no reset) counts as gone: move on
                    self._on_down(f"{self.address}: {e}")
                self._broken_at = self._broken_at or time.time()
                deadline = deadline or time.monotonic() + self.reconnect_s
                if time.monotonic() >= deadline:
                    raise Broken(f"session {self.id}: gateway {self.address} gone ({e}) and none of "
                                 f"{self.gateways} back within {self.reconnect_s:g} s") from None
                await self._failover(deadline)
        action = msg.action if msg.WhichOneof("kind") == "action" else None
        if action is not None:
            t = action.timing
            self.offset.add(t_sent=t.t_sent_ns, gw_recv=t.gateway_recv_ns, gw_send=t.gateway_send_ns,
                            t_recv=self.received_ns)
            self.hops = hops(t, self.received_ns, self.offset.offset_ns)
            self._replied_step = action.step
        if self.logging:
            self.unacked.append((observation, action))
        self._durable(msg.durable_through)
        return msg

    async def close(self) -> None:
        """Half-close, read to the end of the stream and check that it ended OK."""
        if self.call is None:
            return
        await self.call.done_writing()
        try:
            while await asyncio.wait_for(self.call.read(), self.reply_timeout_s) is not grpc.aio.EOF:
                pass
        except TimeoutError:
            raise TimeoutError(f"session {self.id}: {self.address} did not end the stream within "
                               f"{self.reply_timeout_s:g} s of our half-close") from None
        code = await self.call.code()
        if code != grpc.StatusCode.OK:
            raise SessionError(f"session {self.id}: stream ended with {code.name} {await self.call.details()}",
                               code=code)

    async def aclose(self) -> None:
        """Cancel the stream (a no-op once it ended) and close the channels this session made."""
        if self.call is not None:
            self.call.cancel()
        if self._own_channels:
            for channel in self._channels.values():
                await channel.close()
            self._channels.clear()

    # -- internals -------------------------------------------------------------------------------

    async def _hello(self, timeout: float, *, wait_for_ready: bool = False) -> bridge_pb2.Welcome:
        if self.call is not None:
            self.call.cancel()
        self.call = bridge_pb2_grpc.BridgeStub(self.channel(self.address)).Connect(wait_for_ready=wait_for_ready)
        deadline = time.monotonic() + timeout
        self.hello_msg.t_sent_ns = self.clock()
        try:  # with wait_for_ready the write itself waits for the channel: bound it too (an unreachable address)
            await asyncio.wait_for(self._write(bridge_pb2.ClientMessage(hello=self.hello_msg)), timeout)
        except TimeoutError:
            raise TimeoutError(f"session {self.id}: {self.address} not reachable within {timeout:g} s") from None
        msg = await self._read(max(0.05, deadline - time.monotonic()), "Welcome")
        received = self.clock()
        if msg.WhichOneof("kind") != "welcome":
            raise SessionError(f"session {self.id}: expected Welcome from {self.address}, got {msg.WhichOneof('kind')}")
        self.welcome = msg.welcome
        self.offset = ClockOffset()  # a new stream may be another gateway, on another clock
        self.offset.add(t_sent=self.hello_msg.t_sent_ns, gw_recv=msg.welcome.hello_recv_ns,
                        gw_send=msg.welcome.welcome_send_ns, t_recv=received)
        self.hello_msg.session_id = msg.welcome.session_id or self.id
        self.logging = msg.welcome.logging
        self._durable(msg.welcome.durable_through)
        if self._on_up is not None:
            self._on_up(msg.welcome)
        return msg.welcome

    def _durable(self, through: int) -> None:
        self.durable_through = max(self.durable_through, through)
        while self.unacked and self.unacked[0][0].step < through:
            self.unacked.popleft()

    async def _read(self, timeout: float, what: str) -> bridge_pb2.ServerMessage:
        try:
            async with asyncio.timeout(timeout):  # no task per read (wait_for makes one): this is the step path
                msg = await self.call.read()
        except TimeoutError:
            raise TimeoutError(f"session {self.id}: no {what} from {self.address} within {timeout:g} s") from None
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                raise Broken(e.details()) from None
            raise SessionError(f"session {self.id} on {self.address}: {e.code().name}: {e.details()}",
                               code=e.code()) from None
        if msg is grpc.aio.EOF:
            code, details = await self.call.code(), await self.call.details()
            if code == grpc.StatusCode.UNAVAILABLE:
                raise Broken(details)
            raise SessionError(f"session {self.id}: {self.address} ended the stream while we awaited "
                               f"{what}: {code.name} {details}", code=code)
        return msg

    async def _write(self, message: bridge_pb2.ClientMessage) -> None:
        try:
            await self.call.write(message)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as e:
            raise Broken(str(e)) from None

    async def _failover(self, deadline: float) -> None:
        """The next address: Hello with the same id, then Replay what is not durable. Returns without a
        stream if that gateway does not answer (the caller tries again until its deadline)."""
        source = self.address
        self._index = (self._index + 1) % len(self.addresses)
        if len(self.addresses) == 1:
            await asyncio.sleep(0.05)  # the same gateway (or the balancer's pick): give it a moment
        attempt = deadline - time.monotonic()
        if len(self.gateways) > 1:
            attempt = min(attempt, self.connect_timeout_s, 1.0)
        try:
            await self._hello(max(0.1, attempt), wait_for_ready=True)
        except (TimeoutError, Broken):
            return
        self.reconnects += 1
        entries, resent = list(self.unacked), []
        for i, (obs, action) in enumerate(entries):
            if action is None:
                continue  # answered by an error: no transition to log
            replay = bridge_pb2.Replay(observation=obs, action=action)
            if i + 1 < len(entries) and not self.hello_msg.batched:
                replay.next.CopyFrom(entries[i + 1][0])
            await self._write(bridge_pb2.ClientMessage(replay=replay))
            self.replayed += 1
            resent.append(obs.step)
            msg = await self._read(self.reply_timeout_s, f"Replayed for step {obs.step}")
            if msg.WhichOneof("kind") == "error":
                raise SessionError(f"session {self.id}: replay of step {obs.step} refused by {self.address}: "
                                   f"{msg.error.message}")
            self._durable(msg.durable_through)
        first = entries[0][0].step if entries else self.durable_through
        broken_at, self._broken_at = self._broken_at or time.time(), 0.0
        self.failovers.append(Failover(source, self.address, first, tuple(resent), gateway=self.welcome.gateway_id,
                                       epoch=self.welcome.owner_epoch, broken_at=broken_at,
                                       seconds=time.time() - broken_at))
