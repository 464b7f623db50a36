"""The edge's local safety guard: nothing reaches an actuator without passing through it.

The guard sits between the policy's action and the command topic. It clamps positions, limits
how fast the command may change, replaces a silent policy by a safe action (deadline watchdog),
and latches an e-stop that only an operator releases. Every command it sends obeys its limits,
its own safe action included: the watchdog and the e-stop ramp from the last command sent to a
"zero" or explicit safe action at `max_delta` per command and `velocity_limit` per second. It
needs no network and no gateway, and it is deterministic given its clock, so tests pass a fake one.

The call loop (one action per gateway reply, one `tick` per control period):

    >>> clock = iter([0.0, 0.01, 0.02, 0.2, 0.3, 0.3]).__next__
    >>> cfg = GuardConfig(position_low=[-1.0, -1.0], position_high=[1.0, 1.0],
    ...                   velocity_limit=10.0, max_delta=0.5, deadline_s=0.1, safe_action="hold")
    >>> guard = SafetyGuard(cfg, now=clock)
    >>> d = guard.filter(np.array([0.2, 3.0]))                   # t=0.0: clamped to the limits
    >>> d.sent.tolist(), d.clamped, d.rate_limited
    ([0.2, 1.0], True, False)
    >>> d = guard.filter(np.array([0.9, 1.0]))                   # t=0.01: at most 10/s * 0.01 s
    >>> d.sent.round(6).tolist(), d.rate_limited
    ([0.3, 1.0], True)
    >>> guard.tick() is None                                     # t=0.02: the policy is on time
    True
    >>> d = guard.tick()                                         # t=0.2: silent for 0.19 s
    >>> d.sent.round(6).tolist(), d.watchdog, d.requested is None
    ([0.3, 1.0], True, True)
    >>> guard.estop("operator pressed the button")
    True
    >>> d = guard.filter(np.array([0.0, 0.0]))                   # t=0.3: latched, holds
    >>> d.sent.round(6).tolist(), d.estopped, d.requested.tolist()
    ([0.3, 1.0], True, [0.0, 0.0])
    >>> guard.release(operator="ada")                            # t=0.3
    True
    >>> guard.counts
    GuardCounts(clamped=1, rate_limited=1, watchdog=1, estop=1, estopped=False, gateway_estop='')
    >>> guard.counts.to_proto().watchdog
    1

An operator's e-stop through the gateway latches with its id; only a release of that same id frees
it, and a local e-stop over it needs a local release:

    >>> g = SafetyGuard(GuardConfig(position_low=[-1.0], position_high=[1.0]))
    >>> g.estop(GATEWAY_ESTOP, gateway_id="es-7"), g.gateway_estop, g.release_gateway("es-6")
    (True, 'es-7', False)
    >>> g.release_gateway("es-7"), g.estopped
    (True, False)

With `latch_file=` the latch (reason, gateway id) is kept on disk, written atomically and fsynced on
every change: a node restarted after a kill -9 starts latched if it stopped latched, and a file it
cannot read makes it start latched too (fail safe).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from bridge.common.files import write_atomic
from protos.tether.v1 import bridge_pb2

__all__ = ["GATEWAY_ESTOP", "GuardConfig", "GuardCounts", "GuardDecision", "GuardError", "SafetyGuard",
           "write_durable"]

GATEWAY_ESTOP = "e-stop through the gateway (Action.estop)"  # the guard's latch reason for an operator's gateway e-stop
LATCH_FORMAT = "tether-edge-latch/1"

log = logging.getLogger(__name__)


class GuardError(RuntimeError):
    """The guard cannot produce a safe command (e.g. "hold" before anything was ever sent)."""


def _vector(name: str, value: object, n: int | None, *, positive: bool = False) -> tuple[float, ...]:
    """A finite 1-D vector as a tuple of floats; a scalar is broadcast when `n` is known."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected numbers, got {value!r}") from None
    if arr.ndim == 0 and n is not None:
        arr = np.full(n, float(arr))
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D vector, got shape {arr.shape}")
    if n is not None and arr.size != n:
        raise ValueError(f"{name}: expected {n} values (one per joint), got {arr.size}")
    if np.isnan(arr).any():
        raise ValueError(f"{name}: NaN in {arr.tolist()}")
    if positive and (arr <= 0).any():
        raise ValueError(f"{name}: every value must be > 0, got {arr.tolist()}")
    if not positive and not np.isfinite(arr).all():
        raise ValueError(f"{name}: every value must be finite, got {arr.tolist()}")
    return tuple(float(x) for x in arr)


@dataclass(frozen=True, kw_only=True)
class GuardConfig:
    """Limits of one robot's command vector (one entry per joint, in the command's units).

    `velocity_limit` bounds |a_t - a_{t-1}| / dt (units/s, dt from the previous command sent);
    `max_delta` bounds |a_t - a_{t-1}| per command. Either may be a scalar (every joint), a
    per-joint vector (`inf` allowed), or None (off). `safe_action` is what the guard sends when
    the policy is silent for longer than `deadline_s` or while e-stopped: "hold" (the last command
    sent), "zero", or an explicit vector; it must lie inside the position limits.

        >>> GuardConfig(position_low=[-1, -2], position_high=[1, 2], max_delta=0.1).max_delta
        (0.1, 0.1)
        >>> GuardConfig(position_low=[0.5], position_high=[1.0], safe_action="zero")
        Traceback (most recent call last):
        ...
        ValueError: safe_action: 'zero' lies outside [position_low, position_high] at joints [0]
    """

    position_low: tuple[float, ...]
    position_high: tuple[float, ...]
    velocity_limit: tuple[float, ...] | None = None
    max_delta: tuple[float, ...] | None = None
    deadline_s: float = 0.1
    safe_action: Literal["hold", "zero"] | tuple[float, ...] = "hold"

    def __post_init__(self) -> None:
        low = _vector("position_low", self.position_low, None)
        high = _vector("position_high", self.position_high, len(low))
        bad = [i for i, (lo, hi) in enumerate(zip(low, high, strict=True)) if lo > hi]
        if bad:
            raise ValueError(f"position_low: greater than position_high at joints {bad}")
        n = len(low)
        object.__setattr__(self, "position_low", low)
        object.__setattr__(self, "position_high", high)
        for name in ("velocity_limit", "max_delta"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _vector(name, getattr(self, name), n, positive=True))
        if isinstance(self.deadline_s, bool) or not isinstance(self.deadline_s, int | float) \
                or not math.isfinite(self.deadline_s) or self.deadline_s <= 0:
            raise ValueError(f"deadline_s: expected a finite number of seconds > 0, got {self.deadline_s!r}")
        object.__setattr__(self, "deadline_s", float(self.deadline_s))
        safe = self.safe_action
        if isinstance(safe, str):
            if safe not in ("hold", "zero"):
                raise ValueError(f"safe_action: expected 'hold', 'zero' or a vector, got {safe!r}")
            vec = (0.0,) * n if safe == "zero" else None
        else:
            vec = _vector("safe_action", safe, n)
            object.__setattr__(self, "safe_action", vec)
        if vec is not None:
            out = [i for i, x in enumerate(vec) if not low[i] <= x <= high[i]]
            if out:
                shown = safe if isinstance(safe, str) else list(vec)
                raise ValueError(
                    f"safe_action: {shown!r} lies outside [position_low, position_high] at joints {out}")

    @property
    def size(self) -> int:
        """Number of joints (entries of the command vector)."""
        return len(self.position_low)


@dataclass(frozen=True, eq=False)
class GuardDecision:
    """One command the guard let through: what the policy asked for and what was sent.

    `requested` is None for watchdog and e-stop commands that no policy action triggered.
    `ramping` (with `rate_limited`) marks a watchdog or e-stop command that has not reached the safe
    action yet: keep ticking (e.g. before a shutdown) until a decision comes without it.
    Arrays are read-only float64 copies, safe to log with the transition.
    """

    requested: np.ndarray | None
    sent: np.ndarray
    clamped: bool
    rate_limited: bool
    watchdog: bool
    estopped: bool
    t: float
    ramping: bool = False       # a safe command still on its way to the safe action (rate-limited)


@dataclass(frozen=True)
class GuardCounts:
    """Cumulative interventions since the guard started (`tether.v1.GuardReport`)."""

    clamped: int = 0
    rate_limited: int = 0
    watchdog: int = 0
    estop: int = 0
    estopped: bool = False
    gateway_estop: str = ""     # the gateway e-stop id the latch holds for ("" if unlatched or local)

    def to_proto(self) -> bridge_pb2.GuardReport:
        return bridge_pb2.GuardReport(clamped=self.clamped, rate_limited=self.rate_limited,
                                      watchdog=self.watchdog, estop=self.estop, estopped=self.estopped,
                                      gateway_estop=self.gateway_estop)


def write_durable(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace `path` by `data` atomically and durably (bridge.common.files.write_atomic: a temp file,
    fsynced, renamed over `path`, the folder fsynced). A crash leaves the old file or the new one."""
    write_atomic(path, data, mode=mode)


def _read_latch(path: Path) -> tuple[str | None, str]:
    """(reason or None if unlatched, gateway id) from a latch file; a missing file is unlatched,
    one that cannot be read or understood is latched with a reason saying so (fail safe)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        return f"latch file {path} unreadable ({exc}): latched until an operator releases", ""
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("format") != LATCH_FORMAT:
            raise ValueError(f"not a {LATCH_FORMAT} document")
        latched, reason, gateway_id = doc["latched"], doc.get("reason"), doc.get("gateway_estop", "")
        if not isinstance(latched, bool) or not isinstance(gateway_id, str):
            raise ValueError("'latched' must be true/false and 'gateway_estop' a string")
        if latched and (not isinstance(reason, str) or not reason.strip()):
            raise ValueError("latched without a reason")
    except (ValueError, KeyError, UnicodeDecodeError) as exc:
        return f"latch file {path} corrupt ({exc}): latched until an operator releases", ""
    if not latched:
        return None, ""
    return reason, gateway_id if reason == GATEWAY_ESTOP else ""


def _step(last: np.ndarray, target: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """From `last` towards `target` by at most `bound` per element; exactly `target` where in reach
    (last + (target - last) may miss it by a rounding error)."""
    diff = target - last
    return np.where(np.abs(diff) <= bound, target, last + np.minimum(np.maximum(diff, -bound), bound))


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.array(a, dtype=np.float64, copy=True)
    a.flags.writeable = False
    return a


@dataclass
class _State:
    last_sent: np.ndarray | None = None     # what the actuator was last told
    t_sent: float | None = None             # when (for the velocity limit)
    t_fresh: float | None = None            # last policy action; None until the first: watchdog unarmed
    t_tick: float | None = None             # the previous tick (the control period, for the safe ramp)
    missing_start: tuple[int, ...] | None = None  # elements the last start_from lacked (None: never called)
    in_watchdog: bool = False               # inside an expiry episode (counted once)
    estop_reason: str | None = None
    gateway_estop: str = ""                 # with estop_reason == GATEWAY_ESTOP: the gateway's e-stop id
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("clamped", "rate_limited", "watchdog", "estop"), 0))


class SafetyGuard:
    """Clamp, rate-limit, watchdog and e-stop latch for one robot's command vector.

    `initial` is the command the actuator holds at start (e.g. the measured joint positions):
    the first action is then rate-limited from it, and "hold" has something to hold before the
    first action. The watchdog arms on the first action (a robot never commanded needs no safe
    action). Thread-safe: `filter`, `tick`, `estop` and `release` may come from different threads.

    With no start pose (neither `initial` nor a complete `start_from`) the first action is only
    clamped; `missing_start` names the elements without one, and `require_start=True` makes
    `filter` refuse (GuardError) instead of sending such a first command.

    `latch_file` keeps the e-stop latch across restarts (see `write_durable`): every latch, release
    and change of the gateway e-stop id rewrites it before the call returns. At start a file saying
    latched latches the guard with the same reason and gateway id (counted as an e-stop); a file
    that cannot be read or parsed latches it with a reason naming the file and the problem; no file
    means unlatched (a first start).
    """

    def __init__(self, config: GuardConfig, *, now: Callable[[], float] = time.monotonic,
                 initial: Sequence[float] | np.ndarray | None = None, latch_file: Path | str | None = None,
                 require_start: bool = False):
        self.config = config
        self.require_start = bool(require_start)
        self._now = now
        self._low = np.array(config.position_low)
        self._high = np.array(config.position_high)
        self._vel = None if config.velocity_limit is None else np.array(config.velocity_limit)
        self._delta = None if config.max_delta is None else np.array(config.max_delta)
        self._bound = np.full(config.size, np.inf) if self._delta is None else self._delta
        # any finite rate limit: a safe command needs a pose to ramp from (never a jump from nowhere)
        self._limited = bool(np.isfinite(self._bound).any()) or (self._vel is not None
                                                                  and bool(np.isfinite(self._vel).any()))
        self._lock = threading.Lock()
        self._file_lock = threading.Lock()     # latch file writes, in order, outside `_lock`
        self._latch_version = self._written_version = 0
        self._s = _State()
        if initial is not None:
            init = np.array(_vector("initial", initial, config.size))
            out = np.flatnonzero((init < self._low) | (init > self._high)).tolist()
            if out:
                raise ValueError(f"initial: {init.tolist()} lies outside the position limits at joints {out}")
            self._s.last_sent, self._s.t_sent = _frozen(init), now()
        self.latch_file = None if latch_file is None else Path(latch_file)
        if self.latch_file is not None:
            reason, gateway_id = _read_latch(self.latch_file)
            if reason is not None:
                self._s.estop_reason, self._s.gateway_estop = reason, gateway_id
                self._s.counts["estop"] += 1
                log.warning("e-stop latched at start (%s): %s%s", self.latch_file, reason,
                            f" [gateway e-stop {gateway_id}]" if gateway_id else "")

    @property
    def estopped(self) -> bool:
        return self._s.estop_reason is not None

    @property
    def estop_reason(self) -> str | None:
        return self._s.estop_reason

    @property
    def gateway_estop(self) -> str:
        """The gateway e-stop id the latch holds for; "" if unlatched or latched locally."""
        with self._lock:
            return self._gateway_id()

    @property
    def counts(self) -> GuardCounts:
        with self._lock:
            return GuardCounts(**self._s.counts, estopped=self.estopped, gateway_estop=self._gateway_id())

    def filter(self, requested: np.ndarray) -> GuardDecision:
        """The command to send for the policy's action; also feeds the watchdog.

        Raises ValueError for a wrong shape or a non-finite value: that action is not sent and
        does not count as fresh, so a policy emitting NaN ends in the watchdog's safe action.
        Raises GuardError while e-stopped with safe_action "hold" and nothing ever sent.
        """
        req = np.asarray(requested, dtype=np.float64)
        if req.shape != (self.config.size,):
            raise ValueError(f"requested: expected shape ({self.config.size},), got {req.shape}")
        if not np.isfinite(req).all():
            raise ValueError(f"requested: non-finite values {req.tolist()}")
        req = _frozen(req)
        with self._lock:
            t = self._now()
            s = self._s
            if self.require_start and s.last_sent is None:
                missing = self._missing()
                raise GuardError(f"no measured start pose for elements {list(missing)}: refusing a first "
                                 f"command that could only be clamped (call start_from with the measured pose)")
            s.t_fresh, s.in_watchdog = t, False
            if self.estopped:
                if s.last_sent is None and self._limited and self.config.safe_action != "hold":
                    raise GuardError("e-stopped before any command: no pose to ramp the safe action from "
                                     "within the rate limits (call start_from with the measured pose)")
                return self._safe_send(req, t, estopped=True)
            # np.minimum/np.maximum rather than np.clip: the same result, a fraction of the cost on
            # a 6-vector (this runs once per command, up to 1 kHz)
            target = np.minimum(np.maximum(req, self._low), self._high)
            clamped = bool((target != req).any())
            sent = target
            if s.last_sent is not None:
                bound = self._bound
                if self._vel is not None:
                    bound = np.minimum(bound, self._vel * max(t - s.t_sent, 0.0))
                sent = _step(s.last_sent, target, bound)
            rate_limited = bool((sent != target).any())
            s.counts["clamped"] += clamped
            s.counts["rate_limited"] += rate_limited
            return self._send(req, sent, t, clamped=clamped, rate_limited=rate_limited)

    def tick(self) -> GuardDecision | None:
        """Call at the control rate. Returns the safe command to (re)send, or None if none is due.

        While e-stopped every tick returns the safe action. Otherwise, once no action came for
        longer than `deadline_s`, every tick returns the safe action (flag `watchdog`) until the
        next action; `counts.watchdog` grows once per such silence. A "zero" or explicit safe
        action is approached from the last command sent, one limited step per tick (`ramping`):
        at most `max_delta`, and `velocity_limit` times the time since the previous tick or
        command, whichever is later (so a ramp after a silence does not jump by the silence).
        E-stopped before any command (nor `initial`/`start_from`) with a finite rate limit, it
        returns None: there is no pose to ramp from, and the actuator holds on its own.

            >>> clock = iter([0.0, 0.1, 0.2, 0.3, 0.4]).__next__
            >>> g = SafetyGuard(GuardConfig(position_low=[-1.0], position_high=[1.0], velocity_limit=2.0,
            ...                             safe_action="zero"), now=clock, initial=[0.5])
            >>> g.estop("bumper")
            True
            >>> [(d.sent.round(6).tolist(), d.ramping) for d in (g.tick(), g.tick(), g.tick(), g.tick())]
            [([0.3], True), ([0.1], True), ([0.0], False), ([0.0], False)]
        """
        with self._lock:
            t = self._now()
            s = self._s
            if self.estopped:
                if s.last_sent is None and (self.config.safe_action == "hold" or self._limited):
                    s.t_tick = t
                    return None     # never commanded: the actuator holds on its own (no pose to ramp from)
                return self._safe_send(None, t, estopped=True)
            if s.t_fresh is None or t - s.t_fresh <= self.config.deadline_s:
                s.t_tick = t
                return None
            if not s.in_watchdog:
                s.in_watchdog = True
                s.counts["watchdog"] += 1
            return self._safe_send(None, t, watchdog=True)

    @property
    def commanded(self) -> bool:
        """Whether the guard has a command to start from (one was sent, or `initial`/`start_from`)."""
        return self._s.last_sent is not None

    @property
    def missing_start(self) -> tuple[int, ...]:
        """Elements of the command vector with no start pose yet: () once the guard has a command to
        start from; before that, those the last `start_from` lacked (every element if none came).
        A node refuses to start while this is not empty, rather than send a first command that
        could only be clamped."""
        with self._lock:
            return self._missing()

    def start_from(self, measured: Sequence[float | None] | np.ndarray) -> bool:
        """Before any command: the robot's measured pose becomes the command the first action is
        rate-limited from (clipped into the position limits). Ignored (False) once one was sent.
        An element that is None or NaN was not measured: a partial pose is not applied (False)
        and `missing_start` names what it lacked.

            >>> g = SafetyGuard(GuardConfig(position_low=[-1.0, -1.0], position_high=[1.0, 1.0], max_delta=0.1))
            >>> g.start_from([0.5, None]), g.missing_start
            (False, (1,))
            >>> g.start_from([0.5, 0.2]), g.missing_start, g.filter(np.array([-1.0, 0.2])).sent.tolist()
            (True, (), [0.4, 0.2])
            >>> g.start_from([0.0, 0.0])
            False
        """
        values = [np.nan if x is None else x for x in np.asarray(measured, dtype=object).ravel()] \
            if not isinstance(measured, np.ndarray) or measured.dtype == object else measured
        try:
            arr = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"measured: expected numbers (None for an unmeasured element), got {measured!r}") from None
        if arr.shape != (self.config.size,):
            raise ValueError(f"measured: expected {self.config.size} values (one per element), got shape {arr.shape}")
        if np.isinf(arr).any():
            raise ValueError(f"measured: infinite values {arr.tolist()}")
        missing = tuple(np.flatnonzero(np.isnan(arr)).tolist())
        with self._lock:
            if self._s.last_sent is not None:
                return False
            self._s.missing_start = missing
            if missing:
                return False
            self._s.last_sent, self._s.t_sent = _frozen(np.clip(arr, self._low, self._high)), self._now()
            return True

    def estop(self, reason: str, *, supersedes: str | None = None, gateway_id: str = "") -> bool:
        """Latch the e-stop: from now on every output is the safe action, until a release. True if
        this call latched it (False: it already was). A latch whose reason is `supersedes` takes
        this `reason` instead, so a release meant for that one (e.g. the gateway's) leaves it latched:

            >>> g = SafetyGuard(GuardConfig(position_low=[-1.0], position_high=[1.0]))
            >>> g.estop("gateway"), g.estop("local button", supersedes="gateway"), g.estop_reason
            (True, False, 'local button')

        With `gateway_id` the latch is the gateway's (reason `GATEWAY_ESTOP`) for that e-stop id;
        over a gateway latch the id is replaced by the new one; over a local latch nothing changes.
        A local latch over a gateway latch (`supersedes=GATEWAY_ESTOP`) drops the gateway id: only a
        local `release` frees it then, never `release_gateway`.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"reason: expected a non-empty string, got {reason!r}")
        if not isinstance(gateway_id, str):
            raise ValueError(f"gateway_id: expected a string, got {gateway_id!r}")
        gateway_id = gateway_id.strip()
        if gateway_id:
            reason = GATEWAY_ESTOP
        latched, snapshot = False, None
        with self._lock:
            s = self._s
            if s.estop_reason is None:
                s.estop_reason, s.gateway_estop = reason, gateway_id
                s.counts["estop"] += 1
                latched, snapshot = True, self._snapshot()
            elif gateway_id:
                if s.estop_reason == GATEWAY_ESTOP and s.gateway_estop != gateway_id:
                    s.gateway_estop = gateway_id
                    snapshot = self._snapshot()
            elif supersedes is not None and s.estop_reason == supersedes and reason != s.estop_reason:
                s.estop_reason, s.gateway_estop = reason, ""
                snapshot = self._snapshot()
        self._persist(snapshot)
        return latched

    def release(self, *, operator: str) -> bool:
        """Unlatch the e-stop, whoever latched it (an operator's explicit act; who may is the
        caller's policy, e.g. `bridge.ros2.release_auth`). The policy then gets `deadline_s` to send
        a fresh action before the watchdog fires; the first one is rate-limited from the safe
        action. True if it was latched."""
        if not isinstance(operator, str) or not operator.strip():
            raise ValueError(f"operator: expected a non-empty name, got {operator!r}")
        with self._lock:
            if self._s.estop_reason is None:
                return False
            snapshot = self._unlatch()
        self._persist(snapshot)
        return True

    def release_gateway(self, estop_id: str) -> bool:
        """Release the gateway's latch for e-stop `estop_id`, in one step under the guard's lock:
        only if the guard is latched by the gateway with exactly that id (a local e-stop that came
        in between, or a newer gateway e-stop, stays latched). True if it released."""
        if not isinstance(estop_id, str) or not estop_id.strip():
            raise ValueError(f"estop_id: expected a non-empty e-stop id, got {estop_id!r}")
        with self._lock:
            s = self._s
            if s.estop_reason != GATEWAY_ESTOP or not s.gateway_estop or s.gateway_estop != estop_id.strip():
                return False
            snapshot = self._unlatch()
        self._persist(snapshot)
        return True

    # -- the latch file (called without the guard's lock: filter and tick never wait for the disk) --

    def _persist(self, snapshot: tuple[int, dict] | None) -> None:
        """Write a snapshot to `latch_file` before the latch call returns, unless a newer one was
        written already (concurrent changes: the file ends at the newest). A write that fails is
        logged, never raised: the latch in memory holds either way, and a release that could not be
        written leaves the file saying latched (a restart then starts latched: the safe side)."""
        if snapshot is None:
            return
        version, doc = snapshot
        with self._file_lock:
            if version <= self._written_version:
                return
            try:
                write_durable(self.latch_file, json.dumps(doc).encode() + b"\n")
                self._written_version = version
            except OSError as exc:
                log.error("cannot write the e-stop latch file %s (%s): the %s holds in memory only",
                          self.latch_file, exc, "latch" if doc["latched"] else "release")

    # -- internals (called with the lock held) --

    def _missing(self) -> tuple[int, ...]:
        s = self._s
        if s.last_sent is not None:
            return ()
        return tuple(range(self.config.size)) if s.missing_start is None else s.missing_start

    def _safe_send(self, requested: np.ndarray | None, t: float, *, watchdog: bool = False,
                   estopped: bool = False) -> GuardDecision:
        """One step of the ramp from the last command sent towards the safe action, within
        `max_delta` and `velocity_limit` x (t - the later of the last command and the last tick)."""
        s = self._s
        target = self._safe()
        sent, ramping = target, False
        if s.last_sent is not None:
            bound = self._bound
            if self._vel is not None:
                since = s.t_sent if s.t_tick is None else max(s.t_sent, s.t_tick)
                bound = np.minimum(bound, self._vel * max(t - since, 0.0))
            sent = _step(s.last_sent, target, bound)
            ramping = bool((sent != target).any())
        s.t_tick = t
        decision = self._send(requested, sent, t, rate_limited=ramping, watchdog=watchdog, estopped=estopped)
        return dataclasses.replace(decision, ramping=ramping) if ramping else decision

    def _gateway_id(self) -> str:
        return self._s.gateway_estop if self._s.estop_reason == GATEWAY_ESTOP else ""

    def _unlatch(self) -> tuple[int, dict] | None:
        s = self._s
        s.estop_reason, s.gateway_estop = None, ""
        if s.t_fresh is not None:
            s.t_fresh, s.in_watchdog = self._now(), False
        return self._snapshot()

    def _snapshot(self) -> tuple[int, dict] | None:
        """The latch as the latch file's document, numbered in the order of changes (lock held)."""
        if self.latch_file is None:
            return None
        s = self._s
        self._latch_version += 1
        return self._latch_version, {"format": LATCH_FORMAT, "latched": s.estop_reason is not None,
                                     "reason": s.estop_reason, "gateway_estop": s.gateway_estop, "unix": time.time()}

    def _safe(self) -> np.ndarray:
        safe = self.config.safe_action
        if safe == "zero":
            return np.zeros(self.config.size)
        if safe == "hold":
            if self._s.last_sent is None:
                raise GuardError("safe_action='hold' has nothing to hold yet: pass initial= to SafetyGuard")
            return self._s.last_sent
        return np.array(safe)

    def _send(self, requested: np.ndarray | None, sent: np.ndarray, t: float, *, clamped: bool = False,
              rate_limited: bool = False, watchdog: bool = False, estopped: bool = False) -> GuardDecision:
        sent = _frozen(sent)
        self._s.last_sent, self._s.t_sent = sent, t
        return GuardDecision(requested=requested, sent=sent, clamped=clamped, rate_limited=rate_limited,
                             watchdog=watchdog, estopped=estopped, t=t)
