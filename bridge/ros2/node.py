"""The ROS 2 edge node: robot topics in, policy actions through the local safety guard, commands out.

From Python (plain text: it needs a gateway and a robot; `tether edge` wraps exactly this):

    tmap = load_topic_map(DEFAULT_TOPIC_MAP)
    with open_transport("dds", domain_id=0, node_name="tether_edge") as transport:
        node = EdgeNode(config=EdgeConfig(gateway="127.0.0.1:50051", rate_hz=100.0),
                        topic_map=tmap, transport=transport,
                        guard=guard_config(tmap, deadline_s=0.05, safe_action="hold"))
        node.start()
        ...                        # node.stats, node.guard.counts, print(node.status_line())
        node.stop()                # LAST observation, safe action, e-stop latched; raises EdgeError
                                   # if the control loop failed

Each control period (`rate_hz`) the node assembles the latest message of every observation topic
into an observation and sends it on the gateway's Connect stream, unless one is still in flight
(at most one is). The reply's action goes through `SafetyGuard.filter` and out on the command
topics; every period also runs `SafetyGuard.tick`, whose watchdog publishes the safe action once
no fresh action came within the guard's deadline, gateway or no gateway. Each observation
carries `applied_action` (what went out last, after the guard) and the guard's cumulative
`GuardReport`. Steps increase across reconnects; the first observation of every stream is FIRST.

Threads. Three run code of ours; none waits on another's locks for long:

- the transport's receive thread runs the subscription callbacks. They store the latest message
  per observation topic (under a lock), latch or release the guard (itself thread-safe), and
  post an event to the control thread. No conversion, nothing that blocks.
- the link thread (`bridge.ros2.link.GatewayLink`, sync gRPC) connects with bounded backoff,
  reads replies, and posts them as events; gRPC's own thread writes what `send` queued.
- the control thread owns the rest: guard filter/tick, publishers, step counter, the observation
  in flight. It sleeps on its event queue until the next period or the next event, so an action
  is published the moment its reply arrives and an e-stop's safe action the moment it latches.
  It never waits on the network: `send` only queues, and a reply that takes longer than
  `reply_timeout_s` resets the stream.

Latency. `stats.rtt_ns` runs from the control tick to the reply reaching the control thread;
`stats.gateway_ns` and `stats.inference_ns` are its parts inside the gateway and, within that,
Triton's, from the gateway's own timestamps (`Action.timing`), so the rest is the edge and the
network. benchmarks/ros2_edge.py reports them beside a plain grpc.aio session on the same
gateway, paced like the node and back to back. On a small shared machine compare with the paced
one: a loop that idles between steps finds every process and cache cold (on the 2-core dev box
Triton's inference doubles, ~1.1 -> ~2.2 ms, and so does each socket hop), so any client at
100 Hz sees about twice the back-to-back round trip. The node's own share is the assembly before
the send (~0.3 ms there, most of it cold topic-map and guard code) and the thread hops between
the control thread and gRPC (~0.1-0.3 ms, no more than with a grpc.aio link on its own thread).

E-stop (see `bridge.ros2.estop`): True on the topic map's e-stop topic latches the guard, False
does not release it; a `std_msgs/String` with the operator's name on `release_topic` does. The
node reports its latch on `state_topic`.

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
from dataclasses import dataclass

import numpy as np

from bridge.ros2 import messages
from bridge.ros2.edge_config import EdgeConfig, EdgeConfigError
from bridge.ros2.edge_stats import EdgeStats
from bridge.ros2.estop import ESTOP_TOPIC
from bridge.ros2.guard import GuardConfig, GuardDecision, GuardError, SafetyGuard
from bridge.ros2.link import GatewayLink, LinkDown, LinkReply, LinkUp
from bridge.ros2.tensor_layout import TensorLayout
from bridge.ros2.topic_map import MissingMessageError, TopicMap
from bridge.ros2.transport import Transport
from protos import bridge_pb2
from protos.codec import TensorError

log = logging.getLogger("tether.edge")

__all__ = ["EdgeError", "EdgeNode"]

Code = bridge_pb2.StepError.Code
_STATE_PERIOD_S = 1.0


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


class EdgeNode:
    """One robot's edge: subscribes, assembles, sends, guards, publishes (see the module doc).

    The caller owns `transport` (the node subscribes and publishes on it, never closes it).
    """

    def __init__(self, *, config: EdgeConfig, topic_map: TopicMap, transport: Transport, guard: GuardConfig):
        self.config, self.topic_map, self.transport = config, topic_map, transport
        self.guard = SafetyGuard(guard)
        self._action_layout = TensorLayout(topic_map.action_specs())
        if self._action_layout.size != guard.size:
            raise EdgeConfigError(f"guard: limits for {guard.size} values, but the topic map's action "
                                  f"tensors have {self._action_layout.size}")
        self._obs_layout = TensorLayout(topic_map.observation_specs())
        estop = topic_map.estop
        self.estop_topic = estop.topic if estop else ESTOP_TOPIC
        self._estop_reliable = estop.reliable if estop else True
        self.stats = EdgeStats()
        self.welcome: bridge_pb2.Welcome | None = None
        self.last_decision: GuardDecision | None = None
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._latest: dict[str, object] = {}
        self._received: dict[str, float] = {}
        self._latest_lock = threading.Lock()
        hello = bridge_pb2.Hello(
            policy=config.policy, source=f"ros2:{config.node_name}",
            observation_spec=[s.to_proto() for s in self._obs_layout.specs],
            action_spec=[s.to_proto() for s in self._action_layout.specs],
            labels={"node": config.node_name, "rate_hz": f"{config.rate_hz:g}"})
        self._link = GatewayLink(config.gateway, hello, self._events, connect_timeout_s=config.connect_timeout_s,
                                 backoff_s=config.backoff_s)
        self._thread = threading.Thread(target=self._run, name=f"edge-control-{config.node_name}", daemon=True)
        self._stopping = threading.Event()
        self._failure: BaseException | None = None
        self._t0 = time.monotonic()
        # control-thread state
        self._publishers: dict[str, object] = {}
        self._state_publisher = None
        self._generation: int | None = None      # the welcomed stream observations go to
        self._welcomed = 0                       # the newest generation ever welcomed
        self._first = True
        self._step = 0
        self._in_flight: _InFlight | None = None
        self._applied: list = []
        self._next_state = 0.0
        self._warned: set[str] = set()

    # -- the caller's side ----------------------------------------------------------------------

    def start(self) -> None:
        """Subscribe, make the publishers, connect, and start the control loop."""
        t = self.transport
        self._publishers = {e.topic: t.publisher(e.topic, e.type, reliable=e.reliable) for e in self.topic_map.action}
        self._state_publisher = t.publisher(self.config.state_topic, messages.BOOL, reliable=True)
        for entry in self.topic_map.observation:
            t.subscribe(entry.topic, entry.type, functools.partial(self._on_observation, entry.topic),
                        reliable=entry.reliable)
        t.subscribe(self.estop_topic, messages.BOOL, self._on_estop, reliable=self._estop_reliable)
        t.subscribe(self.config.release_topic, messages.STRING, self._on_release, reliable=True)
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
                f"errors {dict(s.errors)}  guard clamped={g.clamped} rate_limited={g.rate_limited} "
                f"watchdog={g.watchdog} estop={g.estop}{'  ESTOPPED' if g.estopped else ''}")

    # -- the transport's receive thread ---------------------------------------------------------

    def _on_observation(self, topic: str, msg: object) -> None:
        with self._latest_lock:
            self._latest[topic] = msg
            self._received[topic] = time.monotonic()

    def _on_estop(self, msg: object) -> None:
        if msg.data:
            self.guard.estop(f"True on {self.estop_topic}")
        self._events.put(_Operator(latch=bool(msg.data)))

    def _on_release(self, msg: object) -> None:
        operator = msg.data.strip()
        if operator:
            self.guard.release(operator=operator)
        self._events.put(_Operator(latch=None, operator=operator))

    # -- the control thread ---------------------------------------------------------------------

    def _run(self) -> None:
        period = 1.0 / self.config.rate_hz
        next_tick = time.monotonic()
        try:
            self._publish_state()
            while not self._stopping.is_set():
                now = time.monotonic()
                if now >= next_tick:
                    next_tick += period
                    if next_tick <= now:
                        self.stats.overruns += 1
                        next_tick = now + period
                    self._tick(now)
                    continue
                try:
                    event = self._events.get(timeout=next_tick - now)
                except queue.Empty:
                    continue
                self._handle(event)
            self._finish()
        except BaseException as exc:  # handed to the owner by stop() / raise_if_failed()
            self._failure = exc
        finally:
            self._link.close()

    def _tick(self, now: float) -> None:
        flight = self._in_flight
        if flight is not None and now - flight.t_sent > self.config.reply_timeout_s:
            self.stats.errors["REPLY_TIMEOUT"] += 1
            self._lose_stream()
            self._link.reset(f"no reply to step {flight.step} within {self.config.reply_timeout_s:g} s")
        if self._generation is None:
            self.stats.skipped["disconnected"] += 1
        elif self._in_flight is not None:
            self.stats.skipped["in_flight"] += 1
        else:
            self._send(now, bridge_pb2.FIRST if self._first else bridge_pb2.MID, self.guard.counts.to_proto())
        decision = self.guard.tick()
        if decision is not None:
            self._publish(decision)
        if now >= self._next_state:
            self._publish_state()

    def _handle(self, event: object) -> None:
        if isinstance(event, LinkReply):
            self._on_reply(event)
        elif isinstance(event, LinkUp):
            self._generation = self._welcomed = event.generation
            self._first, self._in_flight, self.welcome = True, None, event.welcome
            self.stats.connects += 1
            self.stats.policy_version = event.welcome.policy_version
            w = event.welcome
            log.info("gateway %s: session %s, policy %s v%d, inference deadline %d ms (guard's: %g ms)",
                     self.config.gateway, w.session_id, w.policy, w.policy_version, w.deadline_ms,
                     self.guard.config.deadline_s * 1e3)
        elif isinstance(event, LinkDown):
            if event.generation == self._generation:
                self._lose_stream()
        elif isinstance(event, _Operator):
            self._on_operator(event)

    def _lose_stream(self) -> None:
        self._generation, self._in_flight = None, None
        self.stats.disconnects += 1

    def _on_operator(self, event: _Operator) -> None:
        if event.latch is True:
            log.warning("e-stop latched (True on %s)", self.estop_topic)
        elif event.latch is False:
            log.info("False on %s: the e-stop stays %s (release on %s)", self.estop_topic,
                     "latched" if self.guard.estopped else "released", self.config.release_topic)
        elif event.operator:
            log.warning("e-stop released by %s", event.operator)
        else:
            log.warning("ignored a release without an operator name on %s", self.config.release_topic)
        if self.guard.estopped and (decision := self.guard.tick()) is not None:
            self._publish(decision)
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
        if not self._link.send(self._message(arrays, step_type, report), generation=self._generation):
            self.stats.skipped["disconnected"] += 1
            return False
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
        obs.applied_action.extend(self._applied)
        obs.guard.CopyFrom(report)
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
        if kind == "error":
            self.stats.errors[Code.Name(body.code)] += 1
            self._warn_once(f"{Code.Name(body.code)}: {body.message}")
        elif kind == "action":
            self._on_action(body)
            timing = body.timing            # bookkeeping after the commands are out
            if timing.gateway_send_ns and timing.gateway_recv_ns:
                self.stats.gateway_ns.append(timing.gateway_send_ns - timing.gateway_recv_ns)
            if timing.infer_end_ns and timing.infer_start_ns:
                self.stats.inference_ns.append(timing.infer_end_ns - timing.infer_start_ns)

    def _on_action(self, action: bridge_pb2.Action) -> None:
        try:
            vector = self._action_layout.vector(action.tensors)
        except TensorError as exc:
            self.stats.errors["INVALID_ACTION"] += 1
            self._warn_once(f"invalid action from the gateway: {exc}")
            return
        try:
            decision = self.guard.filter(vector)
        except GuardError as exc:
            self.stats.errors["NOTHING_TO_HOLD"] += 1
            self._warn_once(str(exc))
            return
        self.stats.actions += 1
        self.stats.policy_version = action.policy_version
        self._publish(decision)

    def _publish(self, decision: GuardDecision) -> None:
        """Commands out first; then what the next observation reports as applied."""
        arrays = self._action_layout.split(decision.sent)
        for entry, msg in self.topic_map.commands(arrays):
            self._publishers[entry.topic](msg)
        self._applied = self._action_layout.encode(arrays)
        self.last_decision = decision
        self.stats.commands += 1
        self.stats.safe_commands += decision.requested is None or decision.estopped

    def _publish_state(self) -> None:
        self._state_publisher(messages.bool_msg(self.guard.estopped))
        self._next_state = time.monotonic() + _STATE_PERIOD_S

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
        self.guard.estop(f"edge node {self.config.node_name} stopped")
        decision = self.guard.tick()
        if decision is not None:
            self._publish(decision)
        self._publish_state()

    def _drain(self, done, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not done() and (left := deadline - time.monotonic()) > 0:
            try:
                event = self._events.get(timeout=left)
            except queue.Empty:
                return
            self._handle(event)
