"""Operator e-stops that hold sessions: durable in the registry, restored when the gateway starts.

    estops = EStops(registry)                               # the gateway owns one: gateway.estops
    reply = await estops.answer(session, observation)       # the Bridge servicer, for every observation
    done = await estops.estop(Target(robot="arm_1"), who="operator:ada", why="person in the cell")
    done.changed, done.estop.id                             # True, "estop-7-3f09c2aa"
    estops.held_sessions(gateway.sessions.values())         # ["arm-a"]
    await estops.release(Target(robot="arm_1"), who="operator:ada", why="cell clear")

Size: ~410 lines, most of it the durability rules below (memory first, persisted with retries, releases only
once audited), which are one state machine.

An e-stop is a latched selector: a session id, a robot (a session whose Hello labels say robot=NAME, or node=NAME
as the ROS 2 edge node's do) or all. It holds the sessions it matches, those that connect later too (an edge that
reconnects under a new session id is matched by its robot label), until an operator releases it. A held step gets
the safe action (zero clipped into the action spec's bounds) with `Action.estop = true` and `Action.estop_id` = the
holding e-stop's id (all first, then the session's, then the robot's), no inference, and nothing is logged for it
(`session.held_step`: the pending transition is dropped; a single-env LAST still ends its episode).

Released only on purpose: an observation whose `GuardReport.gateway_estop` names an e-stop that the registry says
was released, from a session no standing e-stop holds, gets its policy action with `Action.released_estop` = that
id; the edge releases exactly that latch. An id this registry never issued is never reported released; a session
held by another standing e-stop gets a held reply with that other id.

Durable: each e-stop and release is one registry transaction with its audit event (`Registry.estop/release`), run
off the event loop; what is kept here is a cache of the registry's standing e-stops, replaced after every commit,
read when the gateway starts. An e-stop holds in memory first, at once (its id made here, "estop-<hex>": the one
the registry then records), and is written right after, with a lock timeout (PERSIST_LOCK_TIMEOUT_S); while the
registry is unreachable the write is retried every PERSIST_RETRY_S until it is durable (other gateways then hold too,
as they follow the registry). The call waits PERSIST_WAIT_S for it: not durable by then, it raises EStopNotDurable
(the e-stop holds here all the same). A release is applied only once its audit event is written, and on a shared
registry only after a probe answered (bridge.registry.view): while the database is unreachable it is refused at
once, never sent to commit later. Where: the gateway's registry file; with an in-memory registry (no --model-repository
and no --registry) a registry file of its own at <experience-dir>/.tether/estops.sqlite (`open_estop_registry`);
with neither, in memory only (warned at start, `EStops.durable` False). If the registry cannot record an e-stop, the
gateway holds anyway (a volatile e-stop, id "volatile-..."), and the call raises EStopNotDurable; a release is
applied only once its audit event is written.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bridge.common.errors import InvalidArgument, Unavailable
from bridge.registry import EStopRecord, Registry, RegistryError, RegistryUnavailable, RegistryWriteFailed
from bridge.registry.store import MAX_ESTOP_WHY
from bridge.registry.view import view_of
from protos import bridge_pb2, fleet_pb2
from protos.codec import encode

log = logging.getLogger("tether.gateway.estop")
ROBOT_LABELS = ("robot", "node")  # Hello labels naming a robot: robot=NAME, or the ROS 2 edge node's node=NAME
MAX_NAME = 128
ESTOP_FILE = Path(".tether") / "estops.sqlite"
RELEASED_CACHE = 4096  # released ids remembered (a release is final: never forgotten, only evicted)
PERSIST_WAIT_S = 1.0          # an e-stop call waits this long for its write before saying it is not durable yet
PERSIST_RETRY_S = 0.2         # a write the registry could not take (unreachable, busy) is tried again after this
PERSIST_LOCK_TIMEOUT_S = 1.0  # the write's lock_timeout (statement_timeout twice that)
UNKNOWN_RECHECK_S = 1.0  # an id neither standing nor released is asked of the registry again after this
RELEASED_ASK_S = 0.5     # how long a step waits for the registry's answer to "was it released?"


class BadTarget(InvalidArgument):
    """An e-stop or release target that names no session, robot or all (or more than one)."""


class EStopNotDurable(Unavailable):
    """The e-stop holds, in this process only: the registry could not record it (the reason follows)."""


@dataclass(frozen=True, kw_only=True)
class Target:
    """Whom an e-stop or release addresses: exactly one of a session id, a robot name, or all."""

    session_id: str = ""
    robot: str = ""
    all: bool = False

    def __post_init__(self):
        given = [n for n, v in (("session_id", self.session_id), ("robot", self.robot), ("all", self.all)) if v]
        if len(given) != 1:
            raise BadTarget(f"an e-stop names exactly one of session_id, robot or all; got {given or 'none'}")
        for name in ("session_id", "robot"):
            value = getattr(self, name)
            if len(value) > MAX_NAME or (value and not value.isprintable()):
                raise BadTarget(f"{name} must be printable and at most {MAX_NAME} characters, got {value[:40]!r}")
        if self.session_id and any(c.isspace() for c in self.session_id):
            raise BadTarget(f"session_id must have no spaces (as a Hello's), got {self.session_id[:40]!r}")

    @property
    def key(self) -> str:
        return "all" if self.all else f"session={self.session_id}" if self.session_id else f"robot={self.robot}"

    @classmethod
    def from_key(cls, key: str) -> Target:
        """The inverse of `key`: "all", "session=ID" or "robot=NAME"."""
        if key == "all":
            return cls(all=True)
        kind, _, value = key.partition("=")
        return cls(session_id=value) if kind == "session" else cls(robot=value)

    @classmethod
    def from_proto(cls, request: fleet_pb2.EStopRequest) -> Target:
        which = request.WhichOneof("target")
        if which is None:
            raise BadTarget("an e-stop names exactly one of session_id, robot or all; got none")
        return cls(**{which: getattr(request, which)})


@dataclass(frozen=True)
class Outcome:
    """What an e-stop or release did: `changed` (False: already latched / nothing latched there) and the e-stop."""

    changed: bool
    estop: EStopRecord | None


def open_estop_registry(registry: Registry, experience_dir: Path | None) -> Registry:
    """Where e-stops are kept: `registry` when it is a file; else a registry file of their own in the experience
    dir; else `registry` (in memory: e-stops do not survive a restart, and the gateway says so at start)."""
    if str(registry.path) != ":memory:" or experience_dir is None:
        return registry
    path = Path(experience_dir) / ESTOP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    return Registry(path)


class EStops:
    """The standing e-stops (a cache of the registry's), matching sessions, and the held replies. See the module
    docstring. Reads are on the event loop and cheap (no standing e-stop: one dict check per step)."""

    def __init__(self, registry: Registry):
        self.registry = registry
        self.durable = str(registry.path) != ":memory:"
        self._write_lock = threading.Lock()   # one change at a time, and the cache replaced in commit order
        self._standing: dict[str, EStopRecord] = {r.target: r for r in registry.standing_estops()}
        self._volatile: dict[str, EStopRecord] = {}  # held though the registry could not record them
        self._pending: dict[str, EStopRecord] = {}   # held, being written (retried until durable)
        self._writes: dict[str, asyncio.Task] = {}   # target -> its write, retried while the registry is away
        self._aliases: dict[str, str] = {}            # a standing e-stop's id -> the id this gateway held by first
        self._released: dict[str, None] = {}          # ids known released (insertion-ordered, bounded)
        self._unknown: dict[str, float] = {}          # id -> when the registry last did not know it released
        self._safe: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # session -> encoded safe tensors
        if getattr(registry, "shared", False):  # other gateways latch and release too: re-read when they commit
            registry.listeners.append(self.reload)
        if self._standing:
            log.warning("e-stops standing since before this start, holding their sessions: %s",
                        ", ".join(f"{r.target} ({r.id} by {r.who})" for r in self._standing.values()))
        if not self.durable:
            log.warning("e-stops are kept in memory only and do not survive a restart of the gateway: give it "
                        "--model-repository, --registry or --experience-dir")

    # -- what holds whom ----------------------------------------------------------------------------------------

    def standing(self) -> list[EStopRecord]:
        """Standing e-stops, oldest first (volatile and not yet durable ones included)."""
        held = {**self._pending, **self._volatile, **self._standing}
        return sorted(held.values(), key=lambda r: r.t_ns)

    def holder(self, session) -> EStopRecord | None:
        """The e-stop that holds `session` (anything with `id` and `labels`), or None."""
        standing, volatile, pending = self._standing, self._volatile, self._pending
        if not standing and not volatile and not pending:
            return None
        keys = ["all", f"session={session.id}"]
        labels = getattr(session, "labels", None) or {}
        keys += [f"robot={labels[k]}" for k in ROBOT_LABELS if labels.get(k)]
        for key in keys:
            found = standing.get(key) or volatile.get(key) or pending.get(key)
            if found is not None:
                return found
        return None

    def held_sessions(self, sessions: Iterable) -> list[str]:
        return sorted(s.id for s in list(sessions) if self.holder(s) is not None)

    # -- the control path ---------------------------------------------------------------------------------------

    async def answer(self, session, obs: bridge_pb2.Observation) -> bridge_pb2.ServerMessage:
        """The reply to one observation: held (the safe action, estop=true, estop_id), or the session's own, with
        `released_estop` when the edge reports a latch for an e-stop that was released since."""
        holder = self.holder(session)
        if holder is not None:
            return await self.held(session, obs, holder)
        received = time.time_ns()
        reply = await session.handle(obs)
        if reply.WhichOneof("kind") != "action":
            return reply
        latched = obs.guard.gateway_estop if obs.HasField("guard") else ""
        released = bool(latched) and await self.is_released(latched)
        if (holder := self.holder(session)) is not None:  # latched meanwhile: this step is held too, none of it logged
            session.drop_pending()
            return self._held_reply(session, obs, holder, received)
        if released:
            reply.action.released_estop = latched
        return reply

    async def held(self, session, obs: bridge_pb2.Observation, estop: EStopRecord) -> bridge_pb2.ServerMessage:
        received = time.time_ns()
        if (reply := await session.held_step(obs)) is not None:
            return reply
        return self._held_reply(session, obs, estop, received)

    def _held_reply(self, session, obs: bridge_pb2.Observation, estop: EStopRecord,
                    received: int) -> bridge_pb2.ServerMessage:
        safe = self._safe.get(session)
        if safe is None:
            vector = hasattr(session, "num_envs")  # a vector session's rows, or one env's action (Spec.safe_value)
            safe = self._safe[session] = [
                encode(s.name, np.tile(s.safe_value(), (session.num_envs, *[1] * len(s.shape))) if vector
                       else s.safe_value()) for s in session.action_spec]
        now = time.time_ns()
        timing = bridge_pb2.Timing(t_sent_ns=obs.t_sent_ns, gateway_recv_ns=received, infer_start_ns=now,
                                   infer_end_ns=now, gateway_send_ns=now)
        return bridge_pb2.ServerMessage(action=bridge_pb2.Action(
            step=obs.step, tensors=safe, policy=session.policy.name, policy_version=session.policy.version,
            timing=timing, episode=obs.episode, estop=True, estop_id=estop.id))

    async def is_released(self, estop_id: str) -> bool:
        """Whether the registry says `estop_id` was released (cached: a release is final)."""
        if estop_id in self._released:
            return True
        if any(r.id == estop_id for r in self._standing.values()) or not estop_id.startswith("estop-"):
            return False
        asked = self._unknown.get(estop_id)
        if asked is not None and time.monotonic() - asked < UNKNOWN_RECHECK_S:
            return False
        try:  # a step waits at most RELEASED_ASK_S: no answer means not released (the edge stays latched)
            released = await asyncio.wait_for(asyncio.to_thread(self.registry.released, estop_id), RELEASED_ASK_S)
        except (RegistryError, TimeoutError) as exc:
            log.warning("cannot ask the registry whether %s was released (the edge stays latched): %s", estop_id,
                        exc or f"no answer within {RELEASED_ASK_S:g} s")
            released = False
        if released:
            self._remember_released(estop_id)
            self._unknown.pop(estop_id, None)
        else:
            if len(self._unknown) >= RELEASED_CACHE:
                self._unknown.clear()
            self._unknown[estop_id] = time.monotonic()
        return released

    # -- operator actions ---------------------------------------------------------------------------------------

    async def estop(self, target: Target, *, who: str, why: str) -> Outcome:
        """Latch: held in memory at once (the sessions it matches are held from their next step), then written to
        the registry off the event loop, retried while it is unreachable (see the module docstring)."""
        _check_who_why(who, why)
        key = target.key
        held = self._standing.get(key) or self._volatile.get(key) or self._pending.get(key)
        if held is None and self.durable:
            pending = EStopRecord(id=f"estop-{secrets.token_hex(8)}", target=key, who=who, why=why,
                                  t_ns=time.time_ns())
            self._pending = {**self._pending, key: pending}  # holds from here on: no await before this
            write = self._writes[key] = asyncio.get_running_loop().create_task(self._persist(target, pending),
                                                                               name=f"estop-write {key}")
            write.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved, whoever waits
        write = self._writes.get(key)
        if write is None and held is not None:  # already held: the press audited, if the registry answers in time
            latch = asyncio.get_running_loop().create_task(self._latch(target, who=who, why=why))
            try:
                return await asyncio.wait_for(asyncio.shield(latch), PERSIST_WAIT_S)
            except TimeoutError:
                log.warning("e-stop on %s by %s: already held by %s; this press is audited once the registry "
                            "answers", key, who, held.id)
                return Outcome(False, held)
        if write is None:  # no durable registry: the old path
            return await self._latch(target, who=who, why=why)
        try:
            record, changed = await asyncio.wait_for(asyncio.shield(write), PERSIST_WAIT_S)
        except TimeoutError:
            pending = self._pending.get(key) or held
            raise EStopNotDurable(f"the e-stop on {key} holds ({pending.id}) in this gateway; the registry has not "
                                  f"recorded it yet (registry unreachable or busy): it is written as soon as the "
                                  f"registry answers, and other gateways hold then") from None
        if held is not None:  # pressed again while its first write was under way
            return Outcome(False, record)
        log.warning("e-stop %s on %s by %s%s: %s", record.id, key, who, "" if changed else " (already latched)", why)
        return Outcome(changed, record)

    async def _persist(self, target: Target, pending: EStopRecord) -> tuple[EStopRecord, bool]:
        """Write `pending` until the registry takes it (unreachable or busy: again after PERSIST_RETRY_S). A write the
        registry refuses otherwise (a full disk) leaves a volatile e-stop (EStopNotDurable), as before."""
        key, tries = target.key, 0
        try:
            while True:
                tries += 1
                try:
                    record, changed = await asyncio.to_thread(self._change, self._write_estop, target, pending.who,
                                                              pending)
                except RegistryUnavailable as exc:
                    if tries == 1:
                        log.error("e-stop %s on %s holds in this gateway; writing it to the registry failed (%s): "
                                  "retried every %g s until it is durable", pending.id, key, exc, PERSIST_RETRY_S)
                    await asyncio.sleep(PERSIST_RETRY_S)
                    continue
                except RegistryWriteFailed as exc:
                    volatile = EStopRecord(id=f"volatile-{secrets.token_hex(6)}", target=key, who=pending.who,
                                           why=pending.why, t_ns=pending.t_ns)
                    self._volatile = {**self._volatile, key: volatile}
                    log.error("e-stop %s on %s by %s holds in memory only: %s", volatile.id, key, pending.who, exc)
                    raise EStopNotDurable(f"the e-stop on {key} holds ({volatile.id}), but in this gateway's memory "
                                          f"only: the registry could not record it: {exc}") from exc
                if tries > 1:
                    log.warning("e-stop %s on %s is durable now (after %d tries)", record.id, key, tries)
                if record.id != pending.id:  # another gateway's stood there first: ours released with it
                    self._aliases[record.id] = pending.id
                return record, changed
        finally:
            self._pending = {k: v for k, v in self._pending.items() if k != key}
            self._writes.pop(key, None)

    def _write_estop(self, target: str, *, who: str, why: str, pending: EStopRecord) -> tuple[EStopRecord, bool]:
        return self.registry.estop(target, who=who, why=why, estop_id=pending.id,
                                   lock_timeout_s=PERSIST_LOCK_TIMEOUT_S)

    async def _latch(self, target: Target, *, who: str, why: str) -> Outcome:
        """The registry first, then the cache: a target already held (the press audited), or no durable registry."""
        try:
            record, changed = await asyncio.to_thread(self._change, self.registry.estop, target, who, why)
        except RegistryWriteFailed as exc:  # hold anyway; the operator hears it is not durable
            existing = self._standing.get(target.key) or self._volatile.get(target.key)
            if existing is not None:
                log.error("e-stop on %s by %s: already held by %s, but this press is not audited: %s", target.key,
                          who, existing.id, exc)
                return Outcome(False, existing)
            volatile = EStopRecord(id=f"volatile-{secrets.token_hex(6)}", target=target.key, who=who, why=why,
                                   t_ns=time.time_ns())
            self._volatile = {**self._volatile, target.key: volatile}
            log.error("e-stop %s on %s by %s holds in memory only: %s", volatile.id, target.key, who, exc)
            raise EStopNotDurable(f"the e-stop on {target.key} holds ({volatile.id}), but in this gateway's memory "
                                  f"only: the registry could not record it: {exc}") from exc
        log.warning("e-stop %s on %s by %s%s: %s", record.id, target.key, who, "" if changed else " (already latched)",
                    why)
        return Outcome(changed, record)

    async def release(self, target: Target, *, who: str, why: str) -> Outcome:
        """Unlatch the e-stop standing on that target (others stay). Applied only once its audit event is written;
        refused (RegistryUnavailable) while its e-stop is still being written or a shared registry does not answer."""
        _check_who_why(who, why)
        if target.key in self._writes:
            raise RegistryUnavailable(f"registry unreachable: the e-stop on {target.key} is not recorded yet: it "
                                      "cannot be released before it is")
        if getattr(self.registry, "shared", False):
            await view_of(self.registry).check(f"release of the e-stop on {target.key}")
        volatile = self._volatile.get(target.key)
        record, changed = await asyncio.to_thread(self._change, self.registry.release, target, who, why)
        if volatile is not None:  # the registry wrote the release's audit event (RegistryError otherwise)
            self._volatile = {k: v for k, v in self._volatile.items() if k != target.key}
            record, changed = record or volatile, True
        if changed and record is not None:
            self._remember_released(record.id)
            log.warning("e-stop %s on %s released by %s: %s", record.id, target.key, who, why)
        return Outcome(changed, record)

    def _change(self, act, target: Target, who: str, why: str | EStopRecord):
        """In a worker thread: the registry's transaction, then the cache replaced by what the registry holds."""
        with self._write_lock:
            try:
                if isinstance(why, EStopRecord):  # a held e-stop's write (_persist)
                    return act(target.key, who=why.who, why=why.why, pending=why)
                return act(target.key, who=who, why=why)
            finally:
                try:
                    self._standing = {r.target: r for r in self.registry.standing_estops()}
                except RegistryError as exc:  # keep the cache as it was: it errs on the side of holding
                    log.error("cannot re-read the standing e-stops: %s", exc)

    def reload(self) -> None:
        """Re-read the standing e-stops (blocking: call it in a thread): another gateway on the shared registry
        latched or released one. Unreachable: the cache stays as it was (it errs on the side of holding)."""
        with self._write_lock:
            try:
                self._standing = {r.target: r for r in self.registry.standing_estops()}
            except RegistryError as exc:
                log.warning("cannot re-read the standing e-stops: %s", exc)

    def _remember_released(self, estop_id: str) -> None:
        if (alias := self._aliases.pop(estop_id, None)) is not None:
            self._released[alias] = None
        self._released[estop_id] = None
        while len(self._released) > RELEASED_CACHE:
            del self._released[next(iter(self._released))]


def _check_who_why(who: str, why: str) -> None:
    """The registry's bounds, checked before anything changes, refused as a bad argument naming the field."""
    if not isinstance(who, str) or not 0 < len(who) <= 256 or not who.isprintable():
        raise BadTarget(f"who must be a printable name of 1..256 characters, got {str(who)[:60]!r}")
    if not isinstance(why, str) or len(why) > MAX_ESTOP_WHY or not why.isprintable():
        raise BadTarget(f"why (the reason) must be printable text of at most {MAX_ESTOP_WHY} characters, got "
                        f"{len(why) if isinstance(why, str) else type(why).__name__} characters: {str(why)[:40]!r}")


def selector(record: EStopRecord) -> fleet_pb2.EStopSelector:
    """An e-stop as tether.v1.Fleet shows it."""
    target = Target.from_key(record.target)
    return fleet_pb2.EStopSelector(session_id=target.session_id, robot=target.robot, all=target.all,
                                   who=record.who, why=record.why, t_ns=record.t_ns, id=record.id)
