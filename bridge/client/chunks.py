"""Action chunks, delay-aware: the one control-loop core of the edge node and `tether sim`.

A chunked policy answers one observation with H actions, one per control tick, each action tensor
declared `(H, ...)`. The client keeps the actions it has not executed yet in an `ActionQueue`, by
control tick. `ChunkExecutor` runs the loop around it, the same in `bridge.ros2.node` and `sim.chunked`:

- the observation sent before tick `t` asks for the chunk whose action `i` is for tick `t + i`;
- it arrives `d` ticks later (d, the delay, is measured in control ticks: the tick it arrives before
  minus `t`); its actions for ticks before `t + d` are past and dropped, so the chunk is aligned to the
  tick it was computed for, never replayed from its start;
- meanwhile the robot executes what was queued: the request carries those committed actions
  (`action_prefix`, `(H, A)` float32, the first d rows filled, zero-padded) and d (`action_delay`,
  `(1,)` int32: the delay estimate, the max of the last `delay_window` measured delays, capped at the
  actions queued) when `prefix` is on, so a policy that inpaints its chunk's first d actions to equal
  them (real-time chunking) continues the motion;
- for a policy that ignores the prefix, the seam is blended over `blend` ticks (default H // 4): the
  k-th tick from the arrival (k = 0 .. blend-1) executes old + (k+1)/(blend+1) * (new - old), so a jump
  between the two chunks is spread over blend + 1 steps;
- the next chunk is asked for once no more than `threshold` actions are left (default H // 2), so no
  tick goes idle while d <= threshold.

Overlapping chunks merge per tick: `newest` (default) replaces what was queued, `ensemble` is ACT's
temporal ensembling (weight exp(-decay * i) for the i-th chunk to arrive, the oldest i = 0). Each
executed action names where it came from (`CommandSource`: the chunk id, the step of the observation
it answers; its index in the chunk; the policy version; how many chunks were averaged; the new chunk's
weight in a blended seam).

The loop, on a virtual clock (a robot's runs on its control timer, a simulator's on env steps):

    >>> ex = ChunkExecutor(ChunkConfig(horizon=4, prefix=True), size=1)
    >>> ex.due(0), ex.request(0, step=0).delay                      # nothing queued: ask, nothing committed
    (True, 0)
    >>> ex.arrive(np.arange(4.0).reshape(4, 1), now=0, policy_version=1)   # d = 0: index 0 is tick 0's
    0
    >>> [ex.act(t)[0].tolist() for t in (0, 1, 2)], ex.due(3)        # 1 left for ticks >= 3: <= threshold 2
    ([[0.0], [1.0], [2.0]], True)
    >>> ex.request(3, step=1).tensors()["action_prefix"][:, 0].tolist()   # before tick 3; estimate 0: none
    [0.0, 0.0, 0.0, 0.0]
    >>> ex.act(3)[0].tolist()                                        # tick 3 runs while it is computed
    [3.0]
    >>> ex.arrive(np.full((4, 1), 7.0), now=4, policy_version=1)     # it took 1 tick: its index 1 is tick 4's
    1
    >>> vector, source = ex.act(4)
    >>> vector.tolist(), source.index, ex.delay                      # the next request commits 1 action
    ([7.0], 1, 1)
"""

from __future__ import annotations

import argparse
import math
from collections import Counter, deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

from protos import bridge_pb2
from protos.codec import Spec, encode_all

__all__ = ["DELAY", "MERGES", "PREFIX", "ActionQueue", "Arrival", "ChunkConfig", "ChunkExecutor", "ChunkRequest",
           "CommandSource", "Executed", "chunk_config", "chunk_flags", "prefix_specs"]

MERGES = ("newest", "ensemble")
PREFIX = "action_prefix"           # observation tensor (H, A) float32: the committed actions, zero-padded
DELAY = "action_delay"             # observation tensor (1,) int32: how many rows of the prefix are committed


def prefix_specs(horizon: int, size: int) -> tuple[Spec, Spec]:
    """The two optional policy inputs, as a session declares them in its observation spec.

    >>> [(s.name, s.dtype.name, s.shape) for s in prefix_specs(16, 6)]
    [('action_prefix', 'float32', (16, 6)), ('action_delay', 'int32', (1,))]
    """
    return Spec(PREFIX, np.float32, (horizon, size)), Spec(DELAY, np.int32, (1,))


@dataclass(frozen=True)
class CommandSource:
    """Which chunk produced a command: the chunk's id (its observation's step), the index in it, the
    policy version; `ensembled` chunks were averaged into it (1 unless merge is `ensemble`); `blend` is
    the chunk's weight in a blended seam (1.0 outside one)."""

    chunk: int
    index: int
    policy_version: int
    ensembled: int = 1
    blend: float = 1.0


@dataclass
class _Slot:
    total: np.ndarray              # weighted sum of the chunks' actions for this tick
    weight: float
    count: int
    source: CommandSource          # the newest chunk that contributed


class ActionQueue:
    """Not-yet-executed actions by control tick (see the module doc). One thread only.

    >>> q = ActionQueue(horizon=4, size=1)
    >>> q.add(np.arange(4.0).reshape(4, 1), start=10, now=11, chunk=7, policy_version=3)   # tick 10 is past
    3
    >>> vector, source = q.pop(11)
    >>> vector.tolist(), source
    ([1.0], CommandSource(chunk=7, index=1, policy_version=3, ensembled=1, blend=1.0))
    >>> q.add(np.full((4, 1), 9.0), start=12, now=12, chunk=8, policy_version=3, blend=1)  # 12 blended 1:1
    4
    >>> [q.pop(t)[0].tolist() for t in (12, 13, 14, 15)], q.pop(16)
    ([[5.5], [9.0], [9.0], [9.0]], None)
    >>> e = ActionQueue(horizon=2, size=1, merge="ensemble", decay=0.0)                    # plain mean
    >>> _ = e.add(np.array([[0.0], [2.0]]), start=0, now=0, chunk=0, policy_version=1)
    >>> _ = e.add(np.array([[4.0], [6.0]]), start=1, now=1, chunk=1, policy_version=1)
    >>> e.pop(1)
    (array([3.]), CommandSource(chunk=1, index=0, policy_version=1, ensembled=2, blend=1.0))
    """

    def __init__(self, *, horizon: int, size: int, merge: Literal["newest", "ensemble"] = "newest",
                 decay: float = 0.01):
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"horizon: expected an integer >= 1, got {horizon!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size: expected an integer >= 1 (values per action), got {size!r}")
        if merge not in MERGES:
            raise ValueError(f"merge: expected one of {list(MERGES)}, got {merge!r}")
        if isinstance(decay, bool) or not isinstance(decay, int | float) or not math.isfinite(decay) or decay < 0:
            raise ValueError(f"decay: expected a finite number >= 0, got {decay!r}")
        self.horizon, self.size, self.merge, self.decay = horizon, size, merge, float(decay)
        self._slots: dict[int, _Slot] = {}

    def add(self, actions: np.ndarray, *, start: int, now: int, chunk: int, policy_version: int,
            blend: int = 0, last: np.ndarray | None = None) -> int:
        """Merge a chunk whose first action is for tick `start`; returns how many of its actions are
        still ahead (ticks >= `now`). `blend` (merge `newest` only): the first `blend` ticks from `now`
        cross-fade from what was queued for them (see the module doc); where the old chunk ran out, from
        its last action, or `last` (the last executed action) when nothing was queued at all."""
        actions = np.asarray(actions, np.float64)
        if actions.shape != (self.horizon, self.size):
            raise ValueError(f"chunk: expected shape ({self.horizon}, {self.size}), got {actions.shape}")
        if blend and self.merge != "newest":
            raise ValueError(f"blend: only with merge 'newest', not {self.merge!r}")
        first = max(start, now)
        old = last
        for tick in range(first, start + self.horizon):
            index = tick - start
            slot = self._slots.get(tick)
            if slot is not None:
                old = slot.total / slot.weight
            if old is not None and tick - now < blend:
                w = (tick - now + 1) / (blend + 1)
                self._slots[tick] = _Slot(old + w * (actions[index] - old), 1.0, 1,
                                          CommandSource(chunk, index, policy_version, 1, w))
            elif slot is None or self.merge == "newest":
                self._slots[tick] = _Slot(actions[index].copy(), 1.0, 1, CommandSource(chunk, index, policy_version))
            else:
                w = math.exp(-self.decay * slot.count)
                slot.total += w * actions[index]
                slot.weight += w
                slot.count += 1
                slot.source = CommandSource(chunk, index, policy_version, slot.count)
        return max(0, start + self.horizon - first)

    def peek(self, tick: int) -> np.ndarray | None:
        """The action queued for `tick` (kept), or None."""
        slot = self._slots.get(tick)
        return None if slot is None else slot.total / slot.weight

    def pop(self, tick: int) -> tuple[np.ndarray, CommandSource] | None:
        """The action for `tick` (forgetting every earlier one), or None if none is queued."""
        for old in [t for t in self._slots if t < tick]:
            del self._slots[old]
        slot = self._slots.pop(tick, None)
        return None if slot is None else (slot.total / slot.weight, slot.source)

    def remaining(self, tick: int) -> int:
        """Actions queued for `tick` and later."""
        return sum(t >= tick for t in self._slots)

    def clear(self) -> None:
        self._slots.clear()


def _count(name: str, value: object, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name}: expected an integer {span}, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True)
class ChunkConfig:
    """How chunks execute (see the module doc); ValueError naming the field for a bad one.

    >>> ChunkConfig(horizon=16).threshold, ChunkConfig(horizon=16).blend, ChunkConfig(horizon=16, prefix=True).blend
    (8, 4, 0)
    >>> ChunkConfig(horizon=16, threshold=16)
    Traceback (most recent call last):
    ...
    ValueError: chunk threshold: expected an integer [0, 15], got 16
    """

    horizon: int
    threshold: int | None = None     # ask for the next chunk with this many actions left (None: H // 2)
    merge: str = "newest"            # overlapping chunks: newest | ensemble (ACT)
    decay: float = 0.01              # ensemble weight exp(-decay * i)
    prefix: bool = False             # send action_prefix and action_delay (a policy that inpaints them)
    blend: int | None = None         # seam window in ticks (None: 0 with prefix, else H // 4; newest only)
    delay_window: int = 8            # the delay estimate: the max of this many recent measured delays

    def __post_init__(self) -> None:
        h = _count("chunk horizon", self.horizon, 1, 10_000)
        if self.threshold is None:
            object.__setattr__(self, "threshold", h // 2)
        _count("chunk threshold", self.threshold, 0, h - 1)
        if self.merge not in MERGES:
            raise ValueError(f"chunk merge: expected one of {list(MERGES)}, got {self.merge!r}")
        if isinstance(self.decay, bool) or not isinstance(self.decay, int | float) or not math.isfinite(self.decay) \
                or self.decay < 0:
            raise ValueError(f"ensemble decay: expected a finite number >= 0, got {self.decay!r}")
        if not isinstance(self.prefix, bool):
            raise ValueError(f"chunk prefix: expected True or False, got {self.prefix!r}")
        if self.blend is None:
            object.__setattr__(self, "blend", 0 if self.prefix or self.merge != "newest" else h // 4)
        _count("chunk blend", self.blend, 0, h)
        if self.blend and self.merge != "newest":
            raise ValueError(f"chunk blend: a seam window ({self.blend}) needs merge 'newest', not {self.merge!r}")
        _count("delay window", self.delay_window, 1)


def _optional_int(text: str) -> int | None:
    """An integer flag where "" means "not given" (a launch argument left empty)."""
    return int(text) if text.strip() else None


def _switch(text: str) -> bool:
    """A yes/no flag value (a launch argument passes one): true/false, yes/no, 1/0; "" is no."""
    value = text.strip().lower()
    if value in ("true", "yes", "1"):
        return True
    if value in ("false", "no", "0", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def chunk_flags(parser: argparse.ArgumentParser, *, simulated: bool = False) -> None:
    """The chunk flags of `tether edge` and `tether sim`, one spelling for both; `simulated` adds --chunk-delay.

    >>> p = argparse.ArgumentParser()
    >>> chunk_flags(p)
    >>> chunk_config(p.parse_args(["--chunk", "16", "--chunk-prefix"]))
    ChunkConfig(horizon=16, threshold=8, merge='newest', decay=0.01, prefix=True, blend=0, delay_window=8)
    """
    parser.add_argument("--chunk", type=int, default=0, metavar="H", help="action chunks: the policy returns H "
                        "actions per observation, executed one per control tick (0: one action per observation)")
    parser.add_argument("--chunk-threshold", type=_optional_int, help="request the next chunk with this many "
                        "actions left (default H // 2)")
    parser.add_argument("--chunk-merge", choices=MERGES, default="newest",
                        help="overlapping chunks: the newest wins, or ACT's temporal ensembling")
    parser.add_argument("--ensemble-decay", type=float, default=0.01, help="ensembling weight exp(-decay * i)")
    parser.add_argument("--chunk-prefix", type=_switch, nargs="?", const=True, default=False, metavar="BOOL",
                        help="send the actions committed while a chunk is computed (action_prefix) and their count "
                        "d (action_delay), for a policy that inpaints them (real-time chunking); a bare "
                        "--chunk-prefix is true")
    parser.add_argument("--chunk-blend", type=_optional_int, metavar="TICKS", help="blend each chunk's seam over "
                        "this many ticks (default: 0 with --chunk-prefix, else H // 4)")
    if simulated:
        parser.add_argument("--chunk-delay", type=int, metavar="TICKS", help="the policy's latency in control "
                            "ticks: each chunk is applied this many env steps after its observation (the sim waits "
                            "for a late one). Default: 0 without --rate, measured with it")


def chunk_config(args: argparse.Namespace) -> ChunkConfig | None:
    """`chunk_flags`' settings (None for --chunk 0); ValueError naming a bad one."""
    if not args.chunk:
        return None
    return ChunkConfig(horizon=args.chunk, threshold=args.chunk_threshold, merge=args.chunk_merge,
                       decay=args.ensemble_decay, prefix=args.chunk_prefix, blend=args.chunk_blend)


@dataclass(frozen=True)
class ChunkRequest:
    """One chunk asked for: before tick `tick`, observation `step`, with `delay` committed actions (`prefix`
    rows 0 .. delay-1; the rest zeros)."""

    tick: int
    step: int
    delay: int
    prefix: np.ndarray             # (H, A) float32

    def tensors(self) -> dict[str, np.ndarray]:
        """The optional policy inputs: {action_prefix: (H, A) float32, action_delay: (1,) int32}."""
        return {PREFIX: self.prefix, DELAY: np.array([self.delay], np.int32)}


@dataclass(frozen=True)
class Arrival:
    """A chunk that arrived: its id (step), the tick its action 0 is for, the tick it arrived before, the
    measured delay d (ticks), the delay estimate it was asked with, its actions and policy version."""

    chunk: int
    start: int
    tick: int
    delay: int
    estimate: int
    actions: np.ndarray
    policy_version: int


@dataclass(frozen=True)
class Executed:
    """One tick's action and where it came from."""

    tick: int
    action: np.ndarray
    source: CommandSource


class ChunkExecutor:
    """The delay-aware chunk loop of one robot or env (see the module doc); `size` values per action.

    Per control tick: `act(tick)` (the action for it, None when the queue is empty: an idle tick), then
    `due(tick)` and, with nothing in flight, `request(tick, step=...)`; when the reply comes,
    `arrive(actions, now=tick)` before that tick's `act`. `lost()` forgets a request whose reply will
    not come; `clear()` empties the queue (an e-stop, a new episode). `keep` > 0 keeps that many recent
    `Executed` in `trace` and `Arrival`s in `arrivals` (for reports and tests).
    """

    def __init__(self, config: ChunkConfig, *, size: int, delay: int = 0, keep: int = 0):
        self.config = config
        self._initial = _count("delay", delay, 0, config.horizon)
        self.queue = ActionQueue(horizon=config.horizon, size=size, merge=config.merge, decay=config.decay)
        self.pending: ChunkRequest | None = None
        self.delays: deque[int] = deque(maxlen=config.delay_window)   # measured, the newest last
        self.delay_counts: Counter[int] = Counter()                     # every measured delay
        self.idle = 0                # ticks that found no action after the first chunk arrived
        self.chunks = 0              # chunks arrived
        self.trace: deque[Executed] = deque(maxlen=keep)
        self.arrivals: deque[Arrival] = deque(maxlen=keep)
        self._hop: tuple[int, int, int | None] | None = None   # (chunk, delay, arrived ns): its first action pending
        self._told: tuple[int, int, int] | None = None          # (chunk, delay, execution ns) for the next request
        self._last: np.ndarray | None = None                     # the last action executed

    @property
    def horizon(self) -> int:
        return self.config.horizon

    @property
    def delay(self) -> int:
        """The delay estimate in ticks: the max of the recent measured delays (`delay` before any)."""
        return max(self.delays, default=self._initial)

    def remaining(self, tick: int) -> int:
        return self.queue.remaining(tick)

    def due(self, tick: int) -> bool:
        """Whether the next chunk should be asked for before `tick` (nothing in flight, few actions left)."""
        return self.pending is None and self.queue.remaining(tick) <= self.config.threshold

    def request(self, tick: int, *, step: int) -> ChunkRequest:
        """Ask for the chunk of observation `step`, sent before tick `tick`: the committed prefix."""
        if self.pending is not None:
            raise RuntimeError(f"chunk request for step {step}: step {self.pending.step} is still in flight")
        prefix = np.zeros((self.horizon, self.queue.size), np.float32)
        d = 0
        while d < min(self.delay, self.horizon) and (queued := self.queue.peek(tick + d)) is not None:
            prefix[d] = queued
            d += 1
        self.pending = ChunkRequest(tick, step, d, prefix)
        return self.pending

    def arrive(self, actions: np.ndarray, *, now: int, policy_version: int, at_ns: int | None = None,
               measured: bool = True) -> int:
        """The pending request's chunk, arriving before tick `now`; returns its delay d. `measured=False`:
        the ticks waited for it (a simulator that stopped time) say nothing of the delay estimate."""
        request = self.pending
        if request is None:
            raise RuntimeError("a chunk arrived with no request in flight")
        if now < request.tick:
            raise ValueError(f"chunk of step {request.step} arrived before tick {now}, earlier than its request "
                             f"(tick {request.tick})")
        d = now - request.tick
        self.queue.add(actions, start=request.tick, now=now, chunk=request.step, policy_version=policy_version,
                       blend=self.config.blend, last=self._last)
        self.pending = None
        if measured:
            self.delays.append(d)
        self.delay_counts[d] += 1
        self.chunks += 1
        self._hop = (request.step, d, at_ns)
        if self.arrivals.maxlen:
            self.arrivals.append(Arrival(request.step, request.tick, now, d, request.delay,
                                         np.array(actions, np.float64), policy_version))
        return d

    def act(self, tick: int, *, at_ns: int | None = None) -> tuple[np.ndarray, CommandSource] | None:
        """The action for `tick` (None: an idle tick, counted once a chunk has arrived)."""
        item = self.queue.pop(tick)
        if item is None:
            self.idle += self.chunks > 0
            return None
        if self._hop is not None and item[1].chunk == self._hop[0]:
            chunk, d, arrived = self._hop
            self._told = (chunk, d, 0 if arrived is None or at_ns is None else max(0, at_ns - arrived))
            self._hop = None
        self._last = item[0]
        if self.trace.maxlen:
            self.trace.append(Executed(tick, item[0], item[1]))
        return item

    def deadline_ns(self, tick: int, *, now_ns: int, period_ns: int) -> int:
        """When the queue runs dry (robot clock): `now_ns` + the actions left from `tick` times the period."""
        return now_ns + self.queue.remaining(tick) * period_ns

    def fill(self, observation: bridge_pb2.Observation, request: ChunkRequest, *, deadline_ns: int = 0) -> None:
        """Put the request's part into `observation`: the prefix tensors (with `prefix`), the deadline, and
        the client's hops of the last chunk (its delay in ticks, received -> first action executed)."""
        if self.config.prefix:
            observation.tensors.extend(encode_all(request.tensors()))
        if deadline_ns:
            observation.deadline_ns = deadline_ns
        if self._told is not None:
            chunk, d, execution = self._told
            observation.client_hops.step, observation.client_hops.delay_ticks = chunk, d
            observation.client_hops.execution_ns = execution
            self._told = None

    def lost(self) -> None:
        """The request in flight will not be answered (the stream broke)."""
        self.pending = None

    def clear(self) -> None:
        """Forget every queued action and the request in flight (measured delays stay)."""
        self.queue.clear()
        self.pending, self._hop, self._last = None, None, None
