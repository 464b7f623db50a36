"""The ROS 2 edge node: robot topics in, policy actions through the local safety guard, commands out.

From Python (plain text: it needs a gateway and a robot; `tether edge` wraps exactly this):

    tmap = load_topic_map(DEFAULT_TOPIC_MAP)
    with open_transport("dds", domain_id=0, node_name="tether_edge") as transport:
        node = EdgeNode(config=EdgeConfig(gateway="127.0.0.1:50051", rate_hz=100.0,
                                          latch_file=default_latch_file("tether_edge"),
                                          release_tokens=Path("/etc/tether/release_tokens.json")),
                        topic_map=tmap, transport=transport,
                        guard=guard_config(tmap, deadline_s=0.05, safe_action="hold"))
        node.start()
        ...                        # node.stats, node.guard.counts, print(node.status_line())
        node.stop()                # LAST observation, e-stop latched, safe action (a zero or explicit
                                   # one reached at the velocity limit, within 3 s); raises EdgeError
                                   # if the control loop failed

When an observation goes out. Event-driven: the moment the robot's state arrives on an
observation topic, the latest message of every observation topic becomes an observation and goes
on the gateway's Connect stream, unless one is still in flight (at most one is) or the last one
left less than about a period ago (sends are capped at `rate_hz`: a token bucket with half a
period of slack). A state that arrives while one is in flight goes out when the reply lands. The
control timer (`rate_hz`) is the fallback: it sends the latest state when none went out for 1.5
periods (a silent topic). So the reaction to a new state is one round trip, not a wait for the
next tick plus a round trip.

What goes out on the command topics. Per step (`chunk=0`): the reply's action, through
`SafetyGuard.filter`, published the moment it arrives. With chunks (`chunk=H`, the policy's action
tensors are `(H, ...)`): the chunk loop `tether sim` runs too (`bridge.client.chunks.ChunkExecutor`,
`node.chunks`): the chunk's actions queue by control tick, aligned to the tick its observation was
sent before (the delay d, in ticks, is measured: `stats.chunk_delays`), every tick publishes the next
one through the guard, and the next chunk is requested once no more than `chunk_threshold` actions
are left, so it lands before the queue runs dry (`stats.starved` counts ticks that found it empty; a
period that starts late by whole periods skips their actions, so a chunk stays on the wall clock).
With `chunk_prefix` a request carries the actions committed for the next d ticks (`action_prefix`,
`action_delay`) for a policy that inpaints them; without it the seam is blended over `chunk_blend`
ticks. Each request also carries its deadline (when the queue runs dry) and the previous chunk's hops.
Either way every period also runs `SafetyGuard.tick`, whose watchdog
publishes the safe action once no fresh action came within the guard's deadline, gateway or no
gateway, and every command is kept in `node.command_log` with what produced it (policy version,
chunk id = the step of the observation it answers, index in the chunk). Each observation carries
the guard's cumulative `GuardReport` and, per step, `applied_action` (what went out last, after the
guard; not with chunks: the gateway checks it against the declared action, which is the chunk).
The session id is stable (`EdgeConfig.session_id`, default `<node_name>@<host name>`), and steps
increase across reconnects and restarts: a Welcome's `next_step` (or `durable_through`) above the
node's counter moves it there, so a restarted node or gateway serves it at once. The first
observation of every new session is FIRST (a session resumed on a gateway after a failover, its
replay done, goes on with its episode). The first command starts from the robot's measured pose
(`TopicMap.measured_command`): it is rate-limited from where the robot is, never a jump; a topic
map with a command the node cannot measure (an action entry without joints, or joints no
JointState observation names) is refused when the node is made, and a first action before the
pose is known is not sent (`errors["NO_START_POSE"]`).

A guard that never stops: an undecodable sample or a failing callback is counted by the transport
(`transport.delivery_errors`) and delivery goes on; a malformed message (a wrong-length array) is
counted as BAD_MESSAGE and skipped; an exception in the control thread is counted and logged, and
only a failing transport ends the loop: a publish that fails (any error, rclpy's included), or a
receive loop that died (any exception in it, checked every period through
`transport.raise_if_failed()`). However the loop ends, the guard latches and the safe action is
published first (publishing works after the receive side failed).

Threads. Three run code of ours; none waits on another's locks for long:

- the transport's receive thread runs the subscription callbacks. They store the latest message
  per observation topic (under a lock), latch or release the guard (itself thread-safe), and
  post an event to the control thread. No conversion, nothing that blocks.
- the link (`bridge.ros2.link.GatewayLink`, an adapter over the one client's
  `bridge.client.SessionThread`: an asyncio session on its own thread) connects, fails over along
  the gateway list, replays what the gateway's log lacks after a reconnect, and posts replies as
  events; a session that ends is replaced after a bounded backoff.
- the control thread owns the rest: guard filter/tick, publishers, step counter, the observation
  in flight. It sleeps on its event queue until the next period or the next event, so an action
  is published the moment its reply arrives and an e-stop's safe action the moment it latches.
  It never waits on the network: `send` only queues, and a reply that takes longer than
  `reply_timeout_s` resets the stream.

Latency. `stats.rtt_ns` runs from sending an observation to its reply reaching the control
thread; `stats.gateway_ns` and `stats.inference_ns` are its parts inside the gateway and, within
that, Triton's, from the gateway's own timestamps (`Action.timing`), so the rest is the edge and
the network. benchmarks/ros2_edge.py reports the node's round trip beside what the robot sees
(state -> command, periods answered, jitter) and raw DDS ping-pong. Measured earlier on the
2-core dev box: a loop that idles between steps finds every process and cache cold (Triton's
inference doubles, ~1.1 -> ~2.2 ms, and so does each socket hop), so a 100 Hz client sees about
twice the back-to-back round trip; the node's own share is the assembly before the send (~0.3 ms)
and the thread hops between the control thread and gRPC (~0.1-0.3 ms).

A person's command (see `bridge.ros2.intervention`): with an `intervention:` block in the topic map,
messages on its topic (the action's type and layout: a joystick's or a leader arm's command) override the
policy while they keep arriving within `hold_s` (default two control periods; a dead man's switch: the
override ends by itself when they stop). The command goes out through the same guard, at once on arrival
and every period while it holds (clamped, rate-limited, and never over an e-stop: a latched guard sends its
safe action); the policy's replies are not sent meanwhile (`stats.overridden`), but it is still asked every
step, so the gateway logs its action beside the person's: the next observation reports the person's guarded
command as `applied_action` with `intervention=True`, and `GuardReport.interventions` counts such steps.
Teleop goes on while the gateway is down (the guard's watchdog is fed by the person's commands).

E-stop (see `bridge.ros2.estop`): True on the topic map's e-stop topic latches the guard, False
does not release it; a release on `release_topic` does if it verifies against the node's release
tokens (`EdgeConfig.release_tokens`, `bridge.ros2.release_auth`: signed with an operator's token,
for this node, fresh, never replayed); every other one is refused, and without a tokens file every
one is. Every latch, release and refusal is logged with who and why. The node reports its latch
on `state_topic`. The e-stop topic is read twice: reliable and transient-local (a node that starts
late still sees a standing e-stop from a live durable publisher) and with the topic map's QoS,
volatile (so any publisher matches).

An operator's e-stop through the gateway (`tether estop`, the console) arrives as `Action.estop`
with its id (`estop_id`): the guard latches as the gateway's latch for that id (reason
`GATEWAY_ESTOP`), and every observation reports the id it holds (`GuardReport.gateway_estop`).
Only an action whose `released_estop` names exactly that id releases it
(`SafetyGuard.release_gateway`: check and release in one step), never an action without `estop`;
a local e-stop taken over it needs a local release.

With `EdgeConfig.latch_file` the latch (reason, gateway id) is kept on disk, fsynced, and a node
that stopped latched starts latched (kill -9 included); the node's own latch on a clean stop is
not carried over (a restarted node starts released unless an operator's or a failure's latch was
holding).

Beside it: `bridge.ros2.edge_config` (EdgeConfig, guard_config: the settings, checked up front),
`bridge.ros2.edge_stats` (EdgeStats: what the node counts and times) and
`bridge.ros2.tensor_layout` (TensorLayout: the tensors' wire form, worked out once).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from bridge.client.chunks import ChunkExecutor, CommandSource, prefix_specs
from bridge.ros2 import messages
from bridge.ros2.edge_config import EdgeConfig, EdgeConfigError, unmeasured_commands
from bridge.ros2.edge_stats import EdgeStats
from bridge.ros2.estop import ESTOP_TOPIC
from bridge.ros2.guard import GATEWAY_ESTOP, GuardConfig, GuardDecision, GuardError, SafetyGuard
from bridge.ros2.intervention import Teleop
from bridge.ros2.link import GatewayLink, LinkDown, LinkReply, LinkUp
from bridge.ros2.release_auth import ReleaseAuthority, ReleaseError
from bridge.ros2.tensor_layout import TensorLayout
from bridge.ros2.topic_map import MissingMessageError, TopicMap
from bridge.ros2.transport import Transport, TransportError
from protos import bridge_pb2
from protos.codec import Spec, TensorError

log = logging.getLogger("tether.edge")
# an Action.estop without an id (a gateway from before durable e-stops): no release can name it, so
# it holds until a local release
_UNNAMED_GATEWAY_ESTOP = "(unnamed)"

__all__ = ["CommandRecord", "EdgeError", "EdgeNode"]

Code = bridge_pb2.StepError.Code
_STATE_PERIOD_S = 1.0
_STATE = object()                  # event: a new state arrived while the node wants one
_TELEOP = object()                 # event: a person's command arrived on the intervention topic
_LOG_EVERY_S = 5.0
_SETTLE_S = 3.0                    # on stop or failure: the longest ramp to the safe action the node waits out


class EdgeError(RuntimeError):
    """The control loop stopped on an error (e.g. the transport failed); the cause is chained."""


@dataclass(frozen=True)
class _InFlight:
    step: int
    t_sent: float                  # time.monotonic()


@dataclass(frozen=True)
class _Operator:                   # an e-stop (latch=True/False on the e-stop topic) or a release
    latch: bool | None
    operator: str = ""
    why: str = ""
    released: bool = False         # a verified release that unlatched the guard
    refused: str = ""              # why a release was refused (ReleaseError), "" if it was not


@dataclass(frozen=True)
class CommandRecord:
    """One published command: when (monotonic, the guard's clock), the control tick, the values sent,
    what produced it (None for the guard's own safe action and for a person's command), whether the guard
    clamped or rate-limited it, and whether it was a person's command (the intervention topic)."""

    t: float
    tick: int
    sent: np.ndarray
    source: CommandSource | None
    limited: bool
    person: bool = False


class EdgeNode:
    """One robot's edge: subscribes, assembles, sends, guards, publishes (see the module doc).

    The caller owns `transport` (the node subscribes and publishes on it, never closes it).
    """

    def __init__(self, *, config: EdgeConfig, topic_map: TopicMap, transport: Transport, guard: GuardConfig):
        self.config, self.topic_map, self.transport = config, topic_map, transport
        self.guard = SafetyGuard(guard, latch_file=config.latch_file, require_start=True)
        self._stop_reason = f"edge node {config.node_name} stopped"
        if self.guard.estop_reason == self._stop_reason:     # its own clean stop does not carry over
            self.guard.release(operator=f"{config.node_name} (restarted after a clean stop)")
        elif self.guard.estopped:
            log.warning("edge node %s starts e-stopped (latch file %s): %s%s; an operator must release it",
                        config.node_name, config.latch_file, self.guard.estop_reason,
                        f" [gateway e-stop {self.guard.gateway_estop}]" if self.guard.gateway_estop else "")
        self._action_layout = TensorLayout(topic_map.action_specs())
        if self._action_layout.size != guard.size:
            raise EdgeConfigError(f"guard: limits for {guard.size} values, but the topic map's action "
                                  f"tensors have {self._action_layout.size}")
        try:
            self._releases = ReleaseAuthority.load(config.release_tokens)
        except ReleaseError as exc:
            raise EdgeConfigError(f"release_tokens: {exc}") from None
        if unmeasured := unmeasured_commands(topic_map):
            raise EdgeConfigError("the first command must start from the robot's measured pose, but the topic "
                                  "map's " + "; ".join(unmeasured))
        horizon = config.chunk
        self._teleop: Teleop | None = None
        if topic_map.intervention is not None:
            if horizon:
                raise EdgeConfigError(f"intervention: not with chunk={horizon} (a chunk session reports no "
                                      "applied_action, so a person's command could not be logged beside the policy's)")
            self._teleop = Teleop(hold_s=topic_map.intervention.hold_s or 2.0 / config.rate_hz)
        self._chunks: ChunkExecutor | None = None
        self._reply_layout = self._action_layout
        if horizon:
            # a chunk's bounds: one for all, or the action's per-element bounds once per chunk row
            # (the gateway takes one bound or one per element)
            def rows(bounds: tuple[float, ...]) -> tuple[float, ...]:
                return bounds if len(bounds) <= 1 else bounds * horizon
            self._reply_layout = TensorLayout(tuple(Spec(s.name, s.dtype, (horizon, *s.shape), rows(s.low),
                                                         rows(s.high)) for s in self._action_layout.specs))
            self._chunks = ChunkExecutor(config.chunking(), size=guard.size, keep=10_000)
        self.command_log: deque[CommandRecord] = deque(maxlen=100_000)
        self._obs_layout = TensorLayout(topic_map.observation_specs())
        # the Hello declares the prefix inputs (a policy that inpaints them takes them; others ignore them)
        self._obs_specs = self._obs_layout.specs + (prefix_specs(horizon, guard.size) if config.chunk_prefix
                                                    and horizon else ())
        estop = topic_map.estop
        self.estop_topic = estop.topic if estop else ESTOP_TOPIC
        self._estop_reliable = estop.reliable if estop else True
        self.stats = EdgeStats()
        self.welcome: bridge_pb2.Welcome | None = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._latest: dict[str, object] = {}
        self._received: dict[str, float] = {}
        self._latest_lock = threading.Lock()
        hello = bridge_pb2.Hello(
            session_id=config.session_id, policy=config.policy, source=f"ros2:{config.node_name}",
            observation_spec=[s.to_proto() for s in self._obs_specs],
            action_spec=[s.to_proto() for s in self._reply_layout.specs],
            labels={"node": config.node_name, "rate_hz": f"{config.rate_hz:g}", "chunk": str(horizon)})
        self._link = GatewayLink(config.gateways, hello, self._events, connect_timeout_s=config.connect_timeout_s,
                                 reply_timeout_s=config.reply_timeout_s, backoff_s=config.backoff_s,
                                 credentials=config.credentials())
        self._thread = threading.Thread(target=self._run, name=f"edge-control-{config.node_name}", daemon=True)
        self._transport_failed = getattr(transport, "raise_if_failed", None)
        self._stopping = threading.Event()
        self._failure: BaseException | None = None
        self._t0 = time.monotonic()
        # control-thread state
        self._publishers: dict[str, object] = {}
        self._state_publisher = None
        self._generation: int | None = None      # the welcomed stream observations go to
        self._first = True
        self._step = 0
        self._in_flight: _InFlight | None = None
        self._applied: dict[str, np.ndarray] | None = None    # the last command's arrays (encoded when sent)
        self._person = False                     # the last command was a person's (the intervention topic)
        self._teleop_tick = -1                   # the control tick a person's command last went out in
        self._next_state = 0.0
        self._warned: set[str] = set()
        self._logged: dict[str, float] = {}
        self._ticks = 0                          # control ticks run; a chunk's actions are keyed by tick
        self._period = 1.0 / config.rate_hz
        self._last_send = -1e300                 # monotonic time of the last observation sent
        self._next_send = 0.0                    # the rate cap: no observation before this
        self._fresh = False                      # a state arrived since the last observation went out
        self._want_state = False                 # receive thread: post _STATE on the next state

    # -- the caller's side ----------------------------------------------------------------------

    def start(self) -> None:
        """Subscribe, make the publishers, connect, and start the control loop."""
        t = self.transport
        self._publishers = {e.topic: t.publisher(e.topic, e.type, reliable=e.reliable)
                            for e in self.topic_map.command_entries()}
        self._state_publisher = t.publisher(self.config.state_topic, messages.BOOL, reliable=True)
        for entry in self.topic_map.observation:
            t.subscribe(entry.topic, entry.type, functools.partial(self._on_observation, entry.topic),
                        reliable=entry.reliable)
        # two readers on the e-stop topic: a reliable transient-local one, so a node that starts late
        # still sees a standing e-stop from a live durable publisher (`tether edge estop`), and one with
        # the topic map's QoS, volatile, so any other publisher (a button, `ros2 topic pub`) matches too
        t.subscribe(self.estop_topic, messages.BOOL, self._on_estop, reliable=True, depth=1, durable=True)
        t.subscribe(self.estop_topic, messages.BOOL, self._on_estop, reliable=self._estop_reliable)
        t.subscribe(self.config.release_topic, messages.STRING, self._on_release, reliable=True)
        if self._teleop is not None:
            entry = self.topic_map.intervention.entry
            t.subscribe(entry.topic, entry.type, self._on_teleop, reliable=entry.reliable)
        self._t0 = time.monotonic()
        self._link.start()
        self._thread.start()

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Stop commanding (safe action, e-stop latched), end the episode and the stream."""
        self._stopping.set()
        self._events.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)
        self.raise_if_failed()

    def link_counts(self) -> dict[str, int]:
        """The link's replay figures: transitions replayed and reconnects of the current session, late
        replies dropped, transitions dropped from the bounded replay buffer."""
        session, link = self._link.session, self._link
        return {"replayed": session.replayed if session else 0, "reconnects": session.reconnects if session else 0,
                "late_replies": link.late_replies, "unreplayed_dropped": link.unreplayed_dropped}

    @property
    def chunks(self) -> ChunkExecutor | None:
        """The chunk loop (`bridge.client.chunks`): its measured delays, recent arrivals and executed actions
        (read them once the node stopped); None without chunks."""
        return self._chunks

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def connected(self) -> bool:
        return self._generation is not None

    def raise_if_failed(self) -> None:
        if self._failure is not None:
            raise EdgeError(f"edge node {self.config.node_name} stopped: {self._failure!r}") from self._failure

    def status_line(self) -> str:
        s, g, rtt = self.stats, self.guard.counts, self.stats.rtt_ms()
        link = f"up v{s.policy_version}" if self.connected else "DOWN"
        rtt_text = "-" if rtt["p50"] is None else f"{rtt['p50']:.2f}/{rtt['p99']:.2f} ms"
        gateway, inference = s.gateway_ms()["p50"], s.inference_ms()["p50"]
        if gateway is not None and inference is not None:
            rtt_text += f" (p50 in gateway {gateway:.2f}, of it inference {inference:.2f})"
        return (f"edge {time.monotonic() - self._t0:7.1f}s  gateway {link}  obs {s.observations}  "
                f"actions {s.actions}  commands {s.commands} (safe {s.safe_commands})  rtt p50/p99 {rtt_text}  "
                f"{f'starved {s.starved}/{s.ticks} d {self._chunks.delay}  ' if self._chunks is not None else ''}"
                f"{f'interventions {s.interventions}  ' if self._teleop is not None else ''}"
                f"errors {dict(s.errors)}  undelivered {self._delivery_errors()}  "
                f"guard clamped={g.clamped} rate_limited={g.rate_limited} "
                f"watchdog={g.watchdog} estop={g.estop}{'  ESTOPPED' if g.estopped else ''}"
                f"{f' (gateway e-stop {g.gateway_estop})' if g.gateway_estop else ''}")

    def _delivery_errors(self) -> dict[str, int]:
        errors = getattr(self.transport, "delivery_errors", None)
        return {} if errors is None else errors.counts

    # -- the transport's receive thread ---------------------------------------------------------

    def _on_observation(self, topic: str, msg: object) -> None:
        with self._latest_lock:
            self._latest[topic] = msg
            self._received[topic] = time.monotonic()
            self._fresh = True
        if self._want_state:
            self._want_state = False
            self._events.put(_STATE)

    def _on_teleop(self, msg: object) -> None:
        self._teleop.received(msg, now=time.monotonic())
        self._events.put(_TELEOP)

    def _on_estop(self, msg: object) -> None:
        if msg.data:
            self.guard.estop(f"True on {self.estop_topic}", supersedes=GATEWAY_ESTOP)  # needs a local release
        self._events.put(_Operator(latch=bool(msg.data)))

    def _on_release(self, msg: object) -> None:
        try:
            operator, why = self._releases.verify(msg.data, node=self.config.node_name)
        except ReleaseError as exc:
            self._events.put(_Operator(latch=None, operator=msg.data.partition("|")[0][:64], refused=str(exc)))
            return
        released = self.guard.release(operator=operator)
        self._events.put(_Operator(latch=None, operator=operator, why=why, released=released))

    # -- the control thread ---------------------------------------------------------------------

    def _run(self) -> None:
        period = self._period
        next_tick = time.monotonic()
        try:
            self._publish_state()
            while not self._stopping.is_set():
                now = time.monotonic()
                try:
                    if now >= next_tick:
                        missed = int((now - next_tick) / period)
                        next_tick += period
                        if missed:               # late by whole periods: their chunk actions are past
                            self.stats.overruns += 1
                            self._ticks += missed
                            next_tick = now + period
                        self._tick(now)
                    else:
                        try:
                            event = self._events.get(timeout=next_tick - now)
                        except queue.Empty:
                            continue
                        self._handle(event)
                except TransportError:
                    raise                # publishing cannot work any more: end, safely
                except Exception as exc:  # a bug or a bad value: counted, logged, the loop goes on
                    self.stats.errors["EXCEPTION"] += 1
                    self._log_every("exception", "control thread: %r (counted; the loop goes on)", exc)
                self._want_state = self._wants_state()
            self._finish()
        except BaseException as exc:  # handed to the owner by stop() / raise_if_failed()
            self._failure = exc
            self._fail_safe(exc)
        finally:
            self._link.close()

    def _fail_safe(self, exc: BaseException) -> None:
        """The loop is ending on an error: latch the guard and publish the safe action first."""
        log.error("edge node %s: control loop failed (%r); latching the e-stop, safe action out", self.config.node_name,
                  exc)
        try:
            self.guard.estop(f"control loop of {self.config.node_name} failed: {exc!r}", supersedes=GATEWAY_ESTOP)
            self._publish_state()
            self._settle()
        except Exception as inner:  # the transport itself is gone: nothing more can be sent
            log.error("edge node %s: could not publish the safe action: %r", self.config.node_name, inner)

    def _wants_state(self) -> bool:
        """Whether a new state should wake the control thread (it would be sent at once)."""
        if self._generation is None or self._in_flight is not None:
            return False
        return self._chunks is None or self._chunks.due(self._ticks)

    def _tick(self, now: float) -> None:
        if self._transport_failed is not None:
            self._transport_failed()     # a receive loop that died raises its TransportError here
        flight = self._in_flight
        if flight is not None and now - flight.t_sent > self.config.reply_timeout_s:
            self.stats.errors["REPLY_TIMEOUT"] += 1
            self._lose_stream()
            self._link.reset(f"no reply to step {flight.step} within {self.config.reply_timeout_s:g} s")
        self.stats.ticks += 1
        published = self._execute_chunk(now) if self._chunks is not None else False
        if self._teleop is not None:     # a person's command, every period while it holds
            published = self._teleop_tick == self._ticks or self._apply_teleop(now)
        self._ticks += 1
        if not published and (decision := self.guard.tick()) is not None:
            self._publish(decision, None)
        self._maybe_send(now, timer=True)
        if now >= self._next_state:
            self._publish_state()

    def _execute_chunk(self, now: float) -> bool:
        """Chunk mode: this tick's queued action through the guard and out; False if none."""
        item = self._chunks.act(self._ticks, at_ns=time.monotonic_ns())
        if item is None:
            self.stats.starved += self._chunks.chunks > 0 and self._generation is not None
            return False
        vector, source = item
        decision = self._filter(vector)
        if decision is None:
            return False
        self._publish(decision, source)
        return True

    def _apply_teleop(self, now: float) -> bool:
        """The held person's command through the guard and out; False if none holds (or it could not go out)."""
        msg = self._teleop.held(now=now)
        if msg is None:
            return False
        self._teleop_tick = self._ticks
        try:
            vector = self.topic_map.intervention_vector(msg)
        except messages.MessageError as exc:     # held, but nothing to send: the guard's watchdog takes over
            self.stats.errors["BAD_MESSAGE"] += 1
            self._warn_once(str(exc))
            return False
        decision = self._filter(vector)
        if decision is None:
            return False
        self._publish(decision, None, person=True)
        return True

    def _maybe_send(self, now: float, *, timer: bool) -> None:
        """Send the latest state if one is due (see the module doc: event first, timer as fallback)."""
        if self._stopping.is_set():
            return
        if self._generation is None or self._in_flight is not None:
            if timer:
                self.stats.skipped["disconnected" if self._generation is None else "in_flight"] += 1
            return
        if self._chunks is not None:
            if not self._chunks.due(self._ticks):
                return
        elif not self._fresh and now - self._last_send < 1.5 * self._period:
            return
        if now < self._next_send:
            return
        if self._send(now, bridge_pb2.FIRST if self._first else bridge_pb2.MID, self.guard.counts.to_proto()):
            self._last_send = now
            self._next_send = max(self._next_send, now - self._period / 2) + self._period

    def _handle(self, event: object) -> None:
        if event is _STATE:
            self._maybe_send(time.monotonic(), timer=False)
        elif event is _TELEOP:
            if self._teleop_tick != self._ticks:      # at most one person's command per period
                self._apply_teleop(time.monotonic())
        elif isinstance(event, LinkReply):
            self._on_reply(event)
            if self._fresh:
                self._maybe_send(time.monotonic(), timer=False)
        elif isinstance(event, LinkUp):
            self._generation = event.generation
            # a new session starts an episode; one resumed after a failover (its transitions replayed, the
            # step in flight resent) goes on with it, so the log keeps every step of it
            self._first, self._in_flight, self.welcome = not event.resumed, None, event.welcome
            self.stats.connects += 1
            self.stats.policy_version = event.welcome.policy_version
            w = event.welcome
            resume = max(w.next_step, w.durable_through)
            if resume > self._step:      # a restarted node (or gateway): go on where the session's log is
                log.info("gateway %s: session %s continues at step %d (this node was at %d)", self.config.gateway,
                         w.session_id, resume, self._step)
                self._step = resume
            log.info("gateway %s: session %s, policy %s v%d, inference deadline %d ms (guard's: %g ms)",
                     self.config.gateway, w.session_id, w.policy, w.policy_version, w.deadline_ms,
                     self.guard.config.deadline_s * 1e3)
        elif isinstance(event, LinkDown):
            if event.generation == self._generation:
                flight = self._in_flight          # the session's own reply timeout may come first
                if flight is not None and time.monotonic() - flight.t_sent >= self.config.reply_timeout_s:
                    self.stats.errors["REPLY_TIMEOUT"] += 1
                self._lose_stream()
        elif isinstance(event, _Operator):
            self._on_operator(event)

    def _lose_stream(self) -> None:
        self._generation, self._in_flight = None, None
        if self._chunks is not None:
            self._chunks.lost()
        self.stats.disconnects += 1

    def _on_operator(self, event: _Operator) -> None:
        if event.latch is True:
            log.warning("e-stop latched by a True on %s (%s)", self.estop_topic, self.guard.estop_reason)
            if self._chunks is not None:
                self._chunks.clear()         # a release starts from fresh chunks, not stale ones
        elif event.latch is False:
            log.info("False on %s: the e-stop stays %s (release on %s)", self.estop_topic,
                     "latched" if self.guard.estopped else "released", self.config.release_topic)
        elif event.refused:
            self.stats.errors["RELEASE_REFUSED"] += 1
            log.warning("e-stop release by %r refused (%s); the e-stop stays %s", event.operator, event.refused,
                        "latched" if self.guard.estopped else "released")
        else:
            log.warning("e-stop %s by %s: %s", "released" if event.released else "release (not latched)",
                        event.operator, event.why or "no reason given")
        if self.guard.estopped and (decision := self.guard.tick()) is not None:
            self._publish(decision, None)
        self._publish_state()

    def _send(self, now: float, step_type: int, report: bridge_pb2.GuardReport) -> bool:
        with self._latest_lock:
            latest, received = dict(self._latest), dict(self._received)
        try:
            arrays = self.topic_map.observation_arrays(latest)
        except MissingMessageError:
            self.stats.skipped["waiting"] += 1
            return False
        except messages.MessageError as exc:
            self.stats.errors["BAD_MESSAGE"] += 1
            self._warn_once(str(exc))
            return False
        if any(now - received[e.topic] > self.config.stale_after_s for e in self.topic_map.observation):
            self.stats.skipped["stale"] += 1
            return False
        msg = self._message(arrays, step_type, report)
        if self._chunks is not None:     # the chunk's tick, the committed prefix, when the queue runs dry
            self._chunks.lost()          # nothing is in flight when the node sends
            request = self._chunks.request(self._ticks, step=self._step)
            self._chunks.fill(msg.observation, request, deadline_ns=self._chunks.deadline_ns(
                self._ticks, now_ns=msg.observation.t_sent_ns, period_ns=round(self._period * 1e9)))
        if not self._link.send(msg, generation=self._generation):
            if self._chunks is not None:
                self._chunks.lost()
            self.stats.skipped["disconnected"] += 1
            return False
        self.stats.interventions += msg.observation.intervention
        with self._latest_lock:
            self._fresh = False
        self._in_flight = _InFlight(self._step, now)
        self._step += 1
        self._first = False
        self.stats.observations += 1
        return True

    def _message(self, arrays: dict[str, np.ndarray], step_type: int,
                 report: bridge_pb2.GuardReport) -> bridge_pb2.ClientMessage:
        """This step's observation, filled in place in the message the stream sends (no copies of
        intermediate messages); `arrays` already have the specs' dtypes and shapes."""
        msg = bridge_pb2.ClientMessage()
        obs = msg.observation
        obs.step, obs.t_sent_ns, obs.step_type = self._step, time.time_ns(), step_type
        self._obs_layout.fill(obs.tensors, arrays)
        if self._applied is not None and self._chunks is None:  # a chunk session's action is the chunk
            obs.applied_action.extend(self._action_layout.encode(self._applied))
            obs.intervention = self._person
        obs.guard.CopyFrom(report)
        obs.guard.interventions = self.stats.interventions + obs.intervention
        return msg

    def _on_reply(self, event: LinkReply) -> None:
        msg = event.message
        kind = msg.WhichOneof("kind")
        body = getattr(msg, kind) if kind else None
        flight = self._in_flight
        if event.generation != self._generation or flight is None or kind in (None, "welcome") \
                or body.step != flight.step:
            self.stats.errors["UNEXPECTED_REPLY"] += 1
            self._warn_once(f"unexpected {kind} for step {getattr(body, 'step', '?')} "
                            f"(in flight: {flight.step if flight else None})")
            return
        self._in_flight = None
        self.stats.rtt_ns.append(round((time.monotonic() - flight.t_sent) * 1e9))
        arrived_ns = time.monotonic_ns()
        if kind == "error":
            self.stats.errors[Code.Name(body.code)] += 1
            self._warn_once(f"{Code.Name(body.code)}: {body.message}")
        elif kind == "action":
            self._on_action(body, flight, arrived_ns)
            timing = body.timing            # bookkeeping after the commands are out
            if timing.gateway_send_ns and timing.gateway_recv_ns:
                self.stats.gateway_ns.append(timing.gateway_send_ns - timing.gateway_recv_ns)
            if timing.infer_end_ns and timing.infer_start_ns:
                self.stats.inference_ns.append(timing.infer_end_ns - timing.infer_start_ns)
        if self._chunks is not None:
            self._chunks.lost()          # answered: an error or an unusable action asks again when due

    def _on_action(self, action: bridge_pb2.Action, flight: _InFlight, arrived_ns: int) -> None:
        if action.released_estop or action.estop:
            self._gateway_estop(action)
        try:
            vector = self._reply_layout.vector(action.tensors)
        except TensorError as exc:
            self.stats.errors["INVALID_ACTION"] += 1
            self._warn_once(f"invalid action from the gateway: {exc}")
            return
        self.stats.actions += 1
        self.stats.policy_version = action.policy_version
        if self._teleop is not None and self._teleop.held(now=time.monotonic()) is not None:
            self.stats.overridden += 1   # a person's command acts; the policy's is only logged (the gateway's)
            return
        if self._chunks is not None:     # (H, size): each tensor's (H, n) side by side
            if self._chunks.pending is None:
                return                   # cleared meanwhile (an e-stop): not executed
            horizon = self._chunks.horizon
            parts = self._reply_layout.split(vector)
            chunk = np.concatenate([parts[s.name].reshape(horizon, -1) for s in self._reply_layout.specs], axis=1)
            self.stats.chunk_delays[self._chunks.arrive(chunk, now=self._ticks, policy_version=action.policy_version,
                                                        at_ns=arrived_ns)] += 1
            return
        decision = self._filter(vector)
        if decision is not None:
            self._publish(decision, CommandSource(flight.step, 0, action.policy_version))

    def _gateway_estop(self, action: bridge_pb2.Action) -> None:
        """The gateway's e-stop protocol (see the module doc). A release names the e-stop it ends
        (`released_estop`, the id this node reported in `GuardReport.gateway_estop`) and lifts only a
        gateway latch for exactly that id, in one step of the guard (a local e-stop that came in
        between stays latched). It is applied before a latch in the same action, so a release of
        e-stop A that arrives with e-stop B leaves B latched."""
        changed = False
        if action.released_estop:
            if self.guard.release_gateway(action.released_estop):
                changed = True
                log.warning("e-stop %s released through the gateway", action.released_estop)
            elif self.guard.estopped:
                self._log_every("gateway-release", "the gateway released e-stop %s; this node's latch (%s) stays",
                                action.released_estop, self.guard.gateway_estop or self.guard.estop_reason)
        if action.estop:
            estop_id = action.estop_id or _UNNAMED_GATEWAY_ESTOP
            if self.guard.estop(GATEWAY_ESTOP, gateway_id=estop_id):
                changed = True
                log.warning("e-stop latched: the gateway says an operator e-stopped this robot (e-stop %s)", estop_id)
                if self._chunks is not None:
                    self._chunks.clear()
        if changed:                      # the state topic hears of every change at once (and once a second)
            self._publish_state()

    def _filter(self, vector: np.ndarray) -> GuardDecision | None:
        """The guard's command for a policy action; the very first starts from the measured pose."""
        if not self.guard.commanded:
            with self._latest_lock:
                latest = dict(self._latest)
            measured = self.topic_map.measured_command(latest)
            if measured is not None:
                self.guard.start_from(measured)
                log.info("first command rate-limited from the measured pose %s", np.round(measured, 4).tolist())
        try:
            return self.guard.filter(vector)
        except GuardError as exc:        # no start pose yet (require_start), or "hold" with nothing to hold
            self.stats.errors["NO_START_POSE" if self.guard.missing_start else "NOTHING_TO_HOLD"] += 1
            self._warn_once(str(exc))
        except ValueError as exc:        # a non-finite action: not sent; the watchdog takes over
            self.stats.errors["INVALID_ACTION"] += 1
            self._warn_once(f"invalid action from the gateway: {exc}")
        return None

    def _publish(self, decision: GuardDecision, source: CommandSource | None, *, person: bool = False) -> None:
        """Commands out first; then what the next observation reports as applied (and whether a person's)."""
        arrays = self._action_layout.split(decision.sent)
        for entry, msg in self.topic_map.commands(arrays):
            self._publishers[entry.topic](msg)
        self._applied = arrays
        self.stats.commands += 1
        safe = decision.requested is None or decision.estopped
        self.stats.safe_commands += safe
        self._person = person and not safe       # an e-stop's safe action is the guard's, never a person's
        self.stats.person_commands += self._person
        self.command_log.append(CommandRecord(decision.t, self._ticks, decision.sent, None if safe else source,
                                              decision.clamped or decision.rate_limited, self._person))

    def _publish_state(self) -> None:
        self._state_publisher(messages.bool_msg(self.guard.estopped))
        self._next_state = time.monotonic() + _STATE_PERIOD_S

    def _log_every(self, key: str, fmt: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._logged.get(key, -1e300) >= _LOG_EVERY_S:
            self._logged[key] = now
            log.warning(fmt, *args)

    def _warn_once(self, text: str) -> None:
        if text not in self._warned and len(self._warned) < 100:
            self._warned.add(text)
            log.warning("%s (further occurrences only counted)", text)

    def _finish(self) -> None:
        """On stop: let the reply in flight land, end the episode with a LAST, then stop commanding
        (e-stop latched, safe action published)."""
        self._drain(lambda: self._in_flight is None, 0.5)
        report = self.guard.counts.to_proto()   # before the shutdown latch: not a policy intervention
        if self._generation is not None and self._in_flight is None \
                and self._send(time.monotonic(), bridge_pb2.LAST, report):
            self._drain(lambda: self._in_flight is None, 0.5)
        if self.guard.estop(self._stop_reason):
            log.info("e-stop latched by the node itself: it stopped")
        self._publish_state()
        self._settle()

    def _settle(self) -> None:
        """The loop is ending, latched: publish the guard's safe command every period until it is the
        safe action itself (a "zero" or explicit one is reached by a ramp at the velocity limit) or
        `_SETTLE_S` passed; at least once."""
        end = time.monotonic() + _SETTLE_S
        while (decision := self.guard.tick()) is not None:
            self._publish(decision, None)
            if not decision.ramping:
                return
            if time.monotonic() >= end:
                log.error("edge node %s: stopped %.1f s into the ramp to the safe action, at %s", self.config.node_name,
                          _SETTLE_S, np.round(decision.sent, 4).tolist())
                return
            time.sleep(self._period)

    def _drain(self, done, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done() and (left := deadline - time.monotonic()) > 0:
            try:
                event = self._events.get(timeout=left)
            except queue.Empty:
                return
            self._handle(event)
