"""What one client may hold of the gateway: bounded Hello strings and bounds, session caps, routing.

    limits = Limits(max_sessions=256, max_sessions_per_source=16, max_envs=4096)
    check_hello(hello, limits)                   # InvalidHello naming the field, e.g. "labels: 40 labels (at most 32)"
    admission = Admission(limits)
    admission.admit("s1", peer="robot:arm_1")    # TooManySessions (RESOURCE_EXHAUSTED) past a cap
    admission.release("s1")
    may_route(limits, "robot:arm_1", open_access=False)   # may its labels choose canary membership and pins?

A session's *source* for its cap is who the caller proved to be: its token's or client certificate's
identity ("robot:arm_1"), else (no credentials configured) its network address ("ipv4:10.0.0.7").
`Hello.source` is what the client declares about itself (e.g. "mujoco:Hopper-v5"): it is bounded and
logged, never trusted for quotas, bounds or routing.

Hello's spec bounds (`check_hello`): one value for every element or one per element, never NaN,
`low <= high`; an action tensor's bounds must also be finite (an observation's may be +-inf: "no
bound here", as gymnasium spaces say).

Labels route (label pins, canary labels: bridge.registry.assign) only from identities allowed to
route (`may_route`): everyone under open access, the operator role, and the identities or roles in
`route_labels_from` (e.g. ("robot:arm_2",) or ("robot",)). Other sessions keep their labels for
display and e-stop selection, but the router sees none of them (logged when the session opens).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError

from bridge.common.errors import InvalidArgument
from bridge.gateway.errors import GatewayError, InvalidHello, TooManySessions
from bridge.gateway.session.vector import MAX_ENVS
from bridge.security import peer_identity

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Limits:
    max_sessions: int = 1024            # sessions the gateway holds at once (0 = no cap)
    max_sessions_per_source: int = 256  # per peer identity or address (0 = no cap)
    idle_timeout_s: float = 60.0        # a stream silent this long is closed (0 = never)
    max_message_mb: int = 64            # the largest message a client may send (gRPC refuses larger ones)
    max_id_chars: int = 128             # session_id
    max_source_chars: int = 128         # Hello.source
    max_policy_chars: int = 128         # Hello.policy
    max_labels: int = 32
    max_label_key_chars: int = 64
    max_label_value_chars: int = 256
    max_specs: int = 64                 # tensors in observation_spec, and in action_spec
    max_envs: int = 8192                # Hello.num_envs of a vectorised session (at most 65536)
    route_labels_from: tuple[str, ...] = ()  # identities ("robot:arm_2") or roles ("robot") whose labels route

    def __post_init__(self):
        object.__setattr__(self, "route_labels_from", tuple(self.route_labels_from))
        for who in self.route_labels_from:
            if not isinstance(who, str) or not who or any(c.isspace() for c in who):
                raise ValueError(f"route_labels_from: {who!r} is not an identity (ROLE:NAME) or a role")
        if not 1 <= self.max_envs <= MAX_ENVS:
            raise ValueError(f"max_envs must be in [1, {MAX_ENVS}], got {self.max_envs}")
        for name, value in vars(self).items():
            if isinstance(value, int | float) and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not 1 <= self.max_message_mb <= 1024:
            raise ValueError(f"max_message_mb must be in [1, 1024], got {self.max_message_mb}")


def _text(field: str, value: str, max_chars: int, *, spaces: bool) -> None:
    if len(value) > max_chars:
        raise InvalidHello(f"{field}: {len(value)} characters (at most {max_chars}): {value[:32]!r}...")
    if not value.isprintable() or (not spaces and any(c.isspace() for c in value)):
        raise InvalidHello(f"{field}: only printable characters{'' if spaces else ' without spaces'} "
                           f"are allowed, got {value[:64]!r}")


def check_hello(hello, limits: Limits) -> None:
    """Raise InvalidHello naming the first field out of bounds (the message shows it escaped)."""
    _text("session_id", hello.session_id, limits.max_id_chars, spaces=False)
    _text("source", hello.source, limits.max_source_chars, spaces=True)
    _text("policy", hello.policy, limits.max_policy_chars, spaces=False)
    labels: Mapping[str, str] = hello.labels
    if len(labels) > limits.max_labels:
        raise InvalidHello(f"labels: {len(labels)} labels (at most {limits.max_labels})")
    for key, value in labels.items():
        if not key:
            raise InvalidHello("labels: an empty label key")
        _text("labels key", key, limits.max_label_key_chars, spaces=False)
        _text(f"labels[{key!r}]", value, limits.max_label_value_chars, spaces=True)
    for field in ("observation_spec", "action_spec"):
        if len(getattr(hello, field)) > limits.max_specs:
            raise InvalidHello(f"{field}: {len(getattr(hello, field))} tensors (at most {limits.max_specs})")
        for spec in getattr(hello, field):
            _check_bounds(field, spec, finite=field == "action_spec")
    if hello.num_envs > limits.max_envs:
        raise InvalidHello(f"num_envs: {hello.num_envs} envs (this gateway takes at most {limits.max_envs} "
                           f"per session, --max-envs)")


def _check_bounds(field: str, spec, *, finite: bool) -> None:
    """A TensorSpec's low/high: the right count, no NaN (finite for actions), low <= high."""
    size = math.prod(spec.shape)
    where = f"{field} {spec.name[:64]!r}"
    for side in ("low", "high"):
        values = getattr(spec, side)
        if len(values) not in (0, 1, size):
            raise InvalidHello(f"{where}: {len(values)} {side} bounds for {size} elements of shape "
                               f"{list(spec.shape)} (give one for all, or one per element)")
        bad = [v for v in values if math.isnan(v) or (finite and math.isinf(v))]
        if bad:
            raise InvalidHello(f"{where}: {side} bound {bad[0]} is not {'finite' if finite else 'a number'}")
    low, high = spec.low, spec.high
    for i in range(max(len(low), len(high)) if low and high else 0):  # the sent values only, never the shape's
        lo, hi = low[i if len(low) > 1 else 0], high[i if len(high) > 1 else 0]
        if lo > hi:
            raise InvalidHello(f"{where}: element {i} has low {lo} above high {hi}")


def may_route(limits: Limits, identity: str, *, open_access: bool) -> bool:
    """Whether a session's labels may choose its version (label pins, canary labels): see the module docstring."""
    role = identity.partition(":")[0]
    return open_access or role == "operator" or identity in limits.route_labels_from or \
        role in limits.route_labels_from


class Admission:
    """Counts sessions overall and per source; `admit` refuses past a cap. Not thread-safe: call it
    from the event loop, with no await between the check and adding the session."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self._source: dict[str, str] = {}
        self._per_source: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._source)

    def check(self, peer: str) -> None:
        """Raise TooManySessions if one more session from `peer` would pass a cap."""
        cap, per = self.limits.max_sessions, self.limits.max_sessions_per_source
        if cap and len(self._source) >= cap:
            raise TooManySessions(f"the gateway holds its maximum of {cap} sessions (--max-sessions)")
        if per and self._per_source[peer] >= per:
            raise TooManySessions(f"source {peer!r} holds its maximum of {per} sessions "
                                  f"(--max-sessions-per-source)")

    def admit(self, session_id: str, *, peer: str) -> None:
        """Count the session (`check` first); `release` uncounts it."""
        self.check(peer)
        self._source[session_id] = peer
        self._per_source[peer] += 1

    def source(self, session_id: str) -> str | None:
        """Whom an admitted session counts against: the identity (or, without credentials, the address) that
        opened it; None for an id not admitted."""
        return self._source.get(session_id)

    def release(self, session_id: str) -> None:
        peer = self._source.pop(session_id, None)
        if peer is not None:
            self._per_source[peer] -= 1
            if self._per_source[peer] <= 0:
                del self._per_source[peer]

    def by_source(self) -> dict[str, int]:
        return dict(self._per_source)


class IdleTimeout(GatewayError, status=grpc.StatusCode.DEADLINE_EXCEEDED):
    """A Connect stream sent nothing for `idle_timeout_s`: its session is closed and its slot freed."""


class Undecodable(InvalidArgument):
    """Bytes on a stream that do not parse as its message type (garbage, truncated, another schema)."""


class StreamWatch:
    """What ends a Connect stream's reads: silence (one timer per stream, not one per message: it cancels the
    reading task once it has waited for a message `idle_s`; re-armed only when it fires, so a message costs two
    assignments; 0 = no timer), or `end(error)` from elsewhere (a takeover of its session): the read waiting now,
    or the next one, raises `error`."""

    def __init__(self, idle_s: float):
        self.loop, self.task, self.idle_s = asyncio.get_running_loop(), asyncio.current_task(), idle_s
        self.waiting, self.since = False, self.loop.time()
        self.fired: GatewayError | None = None  # what the reads raise from now on
        self._handle = self.loop.call_at(self.since + idle_s, self._check) if idle_s else None

    def _check(self) -> None:
        now = self.loop.time()
        if self.fired is not None:
            return
        if self.waiting and now - self.since >= self.idle_s:
            self.fired = IdleTimeout(f"no message for {self.idle_s:g} s (--idle-timeout-s): the session is closed")
            self.task.cancel()
        else:
            self._handle = self.loop.call_at((self.since if self.waiting else now) + self.idle_s, self._check)

    def end(self, error: GatewayError) -> None:
        """End the stream with `error`: its read waiting now is cancelled, else its next read raises it."""
        if self.fired is None:
            self.fired = error
            if self.waiting:
                self.task.cancel()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


async def within_idle(messages: AsyncIterator[T], idle_s: float, *,
                      watch: StreamWatch | None = None) -> AsyncIterator[T]:
    """`messages`, raising IdleTimeout when the next one takes longer than `idle_s` (0 = wait forever),
    and Undecodable for bytes that are not a message (instead of an unhandled exception and its log).
    `watch` (made in the reading task: StreamWatch(idle_s)) lets others end the reads (`watch.end`)."""
    watch = watch or StreamWatch(idle_s)
    try:
        while True:
            if watch.fired is not None:
                raise watch.fired
            watch.waiting, watch.since = True, watch.loop.time()
            try:
                message = await anext(messages)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if watch.fired is None:
                    raise
                watch.task.uncancel()
                raise watch.fired from None
            except DecodeError:
                raise Undecodable("a message on this stream does not parse as tether.v1.ClientMessage") from None
            finally:
                watch.waiting = False
            yield message
    finally:
        watch.close()


def peer_key(context) -> str:
    """The source a session counts against when it proved no identity: its certificate identity, else its
    address without the port."""
    if (identity := peer_identity(context)) is not None:
        return str(identity)
    peer = context.peer() or "unknown"
    host, sep, port = peer.rpartition(":")
    return host if sep and port.isdigit() else peer
