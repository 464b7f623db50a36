"""The session factory: a Hello in, a `Session` or `VectorSession` out, with the id and the step it resumes at.

    factory = SessionFactory(limits=..., deadline_s=0.1, switch="episode", catalog=catalog, rollout=rollout,
                             rewards={}, admission=admission, batcher=batcher, sessions=gateway.sessions,
                             experience=lambda: gateway.experience, open_access=lambda: auth.open_access)
    session = await factory.open(hello, peer="ipv4:10.0.0.7", identity="robot:arm_1")
    factory.closed(session)         # remembers its last step, for Welcome.next_step of a reconnect

A Hello naming an id that is connected takes that session over when it comes from the same identity (the
authenticated one with tokens or client certificates; without credentials, the same peer host): a robot
back from a power loss reconnects with its stable id before gRPC keepalive notices its dead connection
(~30 s). The old session is closed as if its stream ended (what it completed is logged, its last step
remembered for Welcome.next_step), then fenced (nothing more of it is logged) and its stream ends with
ABORTED "superseded by a new connection of the same session". Any other authenticated identity gets
PERMISSION_DENIED (without credentials, another peer host: ALREADY_EXISTS), before the ownership claim: the
session keeps its epoch and acts on. The claim itself (bridge.gateway.session.owners) refuses an id bound to another
identity on any gateway sharing the store, before its epoch moves.

It checks the Hello (bounded strings, specs, the policy's compatibility, the reward config), applies
the caps (`Admission`), routes to a version (pins, canary, live: the rollout) and names sessions
that name none: `session-<boot>-<n>`. The gateway (`bridge.gateway.server`) owns the sessions dict.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping

from bridge.gateway.errors import DuplicateSession, InvalidHello, PermissionDenied
from bridge.gateway.session.batcher import MicroBatcher
from bridge.gateway.session.images import DEFAULT_THREADS, ImageDecoder, encoded
from bridge.gateway.session.limits import Admission, Limits, check_hello, may_route
from bridge.gateway.session.recorder import Recorder, RecorderGroup
from bridge.gateway.session.session import Session
from bridge.gateway.session.vector import VectorSession
from bridge.gateway.versions.catalog import PolicyCatalog, check_compatible
from bridge.rewards import RewardConfigError, RewardFunction
from protos import bridge_pb2
from protos.codec import TensorError, specs_from_proto

__all__ = ["SessionFactory"]

log = logging.getLogger("tether.gateway")
REMEMBERED = 4096  # closed sessions whose last step is kept for Welcome.next_step


class SessionFactory:
    def __init__(self, *, limits: Limits, deadline_s: float, switch: str, catalog: PolicyCatalog, rollout,
                 rewards: Mapping[str, RewardFunction], admission: Admission, batcher: MicroBatcher,
                 sessions: MutableMapping[str, Session | VectorSession], experience: Callable[[], object | None],
                 open_access: Callable[[], bool],
                 close: Callable[[Session | VectorSession], None] | None = None,
                 claim: Callable[..., Awaitable[int]] | None = None, decode_threads: int = DEFAULT_THREADS):
        """`close`: what closes a session whose stream ended (Gateway.close_session); a takeover closes the old
        session with it. `claim(session_id, log_keys, identity=...)`: the gateway's ownership claim on the id
        before its recorder reads the log (returns the epoch its transitions carry; see bridge.registry.ownership).
        `decode_threads`: the pool decoding camera frames (session.images), made with the first camera session."""
        self._limits, self._deadline_s, self._switch = limits, deadline_s, switch
        self._catalog, self._rollout, self._rewards = catalog, rollout, rewards
        self._admission, self._batcher, self._sessions = admission, batcher, sessions
        self._experience, self._open_access, self._close = experience, open_access, close
        self._claim = claim
        self._decode_threads, self._images = decode_threads, None
        self._ids = itertools.count(1)  # ids the gateway gives: session-<boot>-<n> (see new_session_id)
        self._boot = secrets.token_hex(4)  # this start's: ids never repeat across restarts
        self._last_seen: OrderedDict[str, int] = OrderedDict()  # closed sessions' last steps (newest REMEMBERED)

    async def open(self, hello: bridge_pb2.Hello, *, peer: str = "local",
                           identity: str | None = None) -> Session | VectorSession:
        """`identity`: who the caller proved to be (`authorize_session`); it is the session's source for the
        per-identity cap, for the gate's bounds, and decides whether its labels route (limits.may_route)."""
        check_hello(hello, self._limits)  # bounded strings and spec bounds, num_envs: InvalidHello naming it
        peer = identity or peer
        if not self._takes_over(hello.session_id, peer):  # a takeover frees the old session's slot below
            self._admission.check(peer)  # caps: TooManySessions (RESOURCE_EXHAUSTED); counted when added below
        try:
            observation = specs_from_proto(hello.observation_spec)
            action = specs_from_proto(hello.action_spec)
        except TensorError as exc:
            raise InvalidHello(f"bad spec in Hello: {exc}") from exc
        if not observation or not action:
            raise InvalidHello("Hello must declare an observation_spec and an action_spec")
        policy = await self._catalog.resolve(hello.policy)
        await self._rollout.track(policy.name)
        if why := check_compatible(policy, observation, action):
            raise InvalidHello(why)
        vector = hello.num_envs > 1 or hello.batched
        if vector and (cameras := encoded(observation)):
            raise InvalidHello(f"observation_spec {sorted(cameras)}: encoded images (JPEG, PNG) are not taken in "
                               "vectorised sessions (num_envs > 1 or batched): send them as RAW uint8 tensors")
        rewards = self._rewards.get(policy.name) or RewardFunction.passthrough()
        try:
            rewards.check_specs(observation, action)
        except RewardConfigError as exc:
            raise InvalidHello(f"the reward config of policy {policy.name!r} does not fit this session: {exc}") from exc
        session_id = hello.session_id or self.new_session_id()
        self._refuse_other(session_id, peer, identity)  # before the claim: a refusal moves no epoch
        experience = None if session_id in self._rollout.evaluating else self._experience()  # the gate's: not data
        keys = [f"{session_id}/{i}" for i in range(max(1, hello.num_envs))] if vector else [session_id]
        if experience is not None and (prepare := getattr(experience, "prepare", None)) is not None:
            await prepare(keys)  # a stream log (JetStream) learns the session's last step there: it may have moved
        # the ownership claim (its last await): from here to the admission nothing awaits
        epoch = await self._claim(session_id, keys, identity=identity) \
            if self._claim is not None and experience is not None else 0
        if (old := self._sessions.get(session_id)) is not None:
            self._refuse_other(session_id, peer, identity)
            self._take_over(old, peer)
        route = dict(hello.labels) if may_route(self._limits, identity or "", open_access=identity is None
                                                or self._open_access()) else {}
        labelled = self._rollout.acting(policy.name, session_id, dict(hello.labels)) if hello.labels and not route \
            else None
        policy = self._rollout.acting(policy.name, session_id, route) or policy  # pins, canary, live
        if hello.labels and not route:
            (log.warning if labelled is not None and labelled is not policy else log.info)(
                "session %s: labels of %s do not route (not an operator, not in --route-labels-from): they "
                "would have chosen %s, it acts with v%d", session_id, identity,
                f"v{labelled.version}" if labelled is not None else "nothing", policy.version)
        self._rollout.declared(policy.name, action, identity=identity, source=f"{peer} {hello.source or session_id}")
        if vector:
            num_envs = max(1, hello.num_envs)
            group = RecorderGroup(session=session_id, source=hello.source, log=experience,
                                  reward_version=rewards.version, num_envs=num_envs)
            group.epoch = epoch
            session = VectorSession(session_id=session_id, source=hello.source, policy=policy, num_envs=num_envs,
                                    observation_spec=observation, action_spec=action, batcher=self._batcher,
                                    deadline_s=self._deadline_s, rewards=rewards, recorder=group,
                                    router=self._rollout, labels=dict(hello.labels))
            session.route_labels = route
            self._admission.admit(session_id, peer=peer)
            self._sessions[session_id] = session
            log.info("vector session %s (%d envs) from %s on %s v%d", session_id, num_envs, hello.source or "?",
                     policy.name, policy.version)
            return session
        recorder = Recorder(session=session_id, source=hello.source, log=experience,
                            reward_version=rewards.version)
        recorder.epoch = epoch
        session = Session(session_id=session_id, source=hello.source, policy=policy,
                          observation_spec=observation, action_spec=action, batcher=self._batcher,
                          deadline_s=self._deadline_s, rewards=rewards, recorder=recorder,
                          router=self._rollout, switch=self._switch, labels=dict(hello.labels),
                          images=self.images() if encoded(observation) else None)
        session.route_labels = route
        self._admission.admit(session_id, peer=peer)
        self._sessions[session_id] = session
        log.info("session %s from %s on %s v%d", session_id, hello.source or "?", policy.name, policy.version)
        return session

    def images(self) -> ImageDecoder:
        """The gateway's pool decoding camera frames, made when the first session with cameras opens."""
        if self._images is None:
            self._images = ImageDecoder(threads=self._decode_threads)
        return self._images

    def close(self) -> None:
        """Stop the image decoding threads (the gateway stops)."""
        if self._images is not None:
            self._images.close()

    def _refuse_other(self, session_id: str, peer: str, identity: str | None) -> None:
        """A session connected here under another identity (else peer host) keeps its id: PermissionDenied for an
        authenticated caller, DuplicateSession (ALREADY_EXISTS) without credentials."""
        if session_id not in self._sessions or self._takes_over(session_id, peer):
            return
        if identity is None:
            raise DuplicateSession(f"session {session_id!r} is already connected")
        log.warning("session %s: Hello from %s refused: connected here under another identity", session_id, identity)
        raise PermissionDenied(f"session {session_id!r} is already connected under another identity: {identity} "
                               "may not take it over (PERMISSION_DENIED before any epoch moved)")

    def _takes_over(self, session_id: str, peer: str) -> bool:
        """Whether a Hello for `session_id` from `peer` (identity, else address) takes a connected session over."""
        return bool(session_id) and session_id in self._sessions and self._admission.source(session_id) == peer

    def _take_over(self, old: Session | VectorSession, peer: str) -> None:
        """Close `old` (its completed steps logged, its slot freed, its last step remembered), fence it and end
        its stream: from here on only the new session appends for the id. No await: atomic with the admission."""
        if self._close is not None:
            self._close(old)
        else:
            self._admission.release(old.id)
            old.flush()
            del self._sessions[old.id]
            self.closed(old)
        old.supersede(f"session {old.id!r} is superseded by a new connection of the same session (from {peer})")
        log.warning("session %s taken over by a new connection of %s: the old stream ends (ABORTED), nothing more "
                    "of it is logged; last step %s", old.id, peer, getattr(old, "_last_step", None))

    def new_session_id(self) -> str:
        """An id for a client that names none: `session-<boot>-<n>`, with a random boot component of
        this gateway start, so ids never repeat across restarts (the log remembers old sessions'
        last steps: a repeated id would make a fresh client's step 0 OUT_OF_ORDER); an id the log or
        this gateway already knows is skipped."""
        while True:
            session_id = f"session-{self._boot}-{next(self._ids)}"
            known = (log_ := self._experience()) is not None and log_.last_step(session_id) is not None
            if not known and session_id not in self._sessions and session_id not in self._last_seen:
                return session_id

    def next_step(self, session: Session | VectorSession) -> int:
        """Welcome.next_step: the lowest step accepted next for this id, the last step the log or this
        gateway has seen of it + 1 (0 for a new id). A client continuing its counter from here is never
        OUT_OF_ORDER."""
        seen = self._last_seen.get(session.id)
        return max(session.recorder.next_step, 0 if seen is None else seen + 1)

    def closed(self, session: Session | VectorSession) -> None:
        """Remember a closed session's last step (for Welcome.next_step of its reconnect)."""
        last = getattr(session, "_last_step", None)
        if last is not None:
            self._last_seen[session.id] = last
            self._last_seen.move_to_end(session.id)
            while len(self._last_seen) > REMEMBERED:
                self._last_seen.popitem(last=False)
