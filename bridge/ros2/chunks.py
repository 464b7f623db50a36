"""Action chunks: a policy answers one observation with H future actions, one per control tick.

The policy declares each action tensor with a leading horizon, shape `(H, ...)`. The edge node
keeps the actions it has not executed yet in an `ActionQueue`, keyed by control tick: a chunk
computed from the observation sent before tick `start` holds the actions for ticks
`start .. start + H - 1`; when it arrives at tick `now`, the actions for ticks before `now` are
stale and dropped. The node asks for the next chunk once `remaining(now)` falls to its threshold,
so the next one lands before the current one runs out. Overlapping chunks merge per tick:

- `newest` (default): the newest chunk's action replaces what was queued for that tick;
- `ensemble`: ACT's temporal ensembling, a weighted mean of every chunk's action for that tick,
  weight exp(-decay * i) for the i-th chunk to arrive (the oldest has i = 0, the largest weight).

Each popped action names where it came from (`CommandSource`: the chunk's id, which is the step
of the observation it answers, its index in the chunk and the policy version).

    >>> q = ActionQueue(horizon=4, size=1)
    >>> q.add(np.arange(4.0).reshape(4, 1), start=10, now=11, chunk=7, policy_version=3)   # tick 10 is past
    3
    >>> q.remaining(11)
    3
    >>> vector, source = q.pop(11)
    >>> vector.tolist(), source
    ([1.0], CommandSource(chunk=7, index=1, policy_version=3, ensembled=1))
    >>> q.add(np.full((4, 1), 9.0), start=12, now=12, chunk=8, policy_version=3)           # newest wins
    4
    >>> [q.pop(t)[0].tolist() for t in (12, 13, 14, 15)], q.pop(16)
    ([[9.0], [9.0], [9.0], [9.0]], None)
    >>> e = ActionQueue(horizon=2, size=1, merge="ensemble", decay=0.0)                    # plain mean
    >>> _ = e.add(np.array([[0.0], [2.0]]), start=0, now=0, chunk=0, policy_version=1)
    >>> _ = e.add(np.array([[4.0], [6.0]]), start=1, now=1, chunk=1, policy_version=1)
    >>> e.pop(1)
    (array([3.]), CommandSource(chunk=1, index=0, policy_version=1, ensembled=2))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["MERGES", "ActionQueue", "CommandSource"]

MERGES = ("newest", "ensemble")


@dataclass(frozen=True)
class CommandSource:
    """Which chunk produced a command: the chunk's id (its observation's step), the index in it, the
    policy version; `ensembled` chunks were averaged into it (1 unless merge is `ensemble`)."""

    chunk: int
    index: int
    policy_version: int
    ensembled: int = 1


@dataclass
class _Slot:
    total: np.ndarray              # weighted sum of the chunks' actions for this tick
    weight: float
    count: int
    source: CommandSource          # the newest chunk that contributed


class ActionQueue:
    """Not-yet-executed actions by control tick (see the module doc). Control thread only."""

    def __init__(self, *, horizon: int, size: int, merge: Literal["newest", "ensemble"] = "newest",
                 decay: float = 0.01):
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"horizon: expected an integer >= 1, got {horizon!r}")
        if merge not in MERGES:
            raise ValueError(f"merge: expected one of {list(MERGES)}, got {merge!r}")
        if isinstance(decay, bool) or not isinstance(decay, int | float) or not math.isfinite(decay) or decay < 0:
            raise ValueError(f"decay: expected a finite number >= 0, got {decay!r}")
        self.horizon, self.size, self.merge, self.decay = horizon, size, merge, float(decay)
        self._slots: dict[int, _Slot] = {}

    def add(self, actions: np.ndarray, *, start: int, now: int, chunk: int, policy_version: int) -> int:
        """Merge a chunk whose first action is for tick `start`; returns how many of its actions
        are still ahead (ticks >= `now`)."""
        actions = np.asarray(actions, np.float64)
        if actions.shape != (self.horizon, self.size):
            raise ValueError(f"chunk: expected shape ({self.horizon}, {self.size}), got {actions.shape}")
        first = max(start, now)
        for tick in range(first, start + self.horizon):
            index = tick - start
            source = CommandSource(chunk, index, policy_version)
            slot = self._slots.get(tick)
            if slot is None or self.merge == "newest":
                self._slots[tick] = _Slot(actions[index].copy(), 1.0, 1, source)
                continue
            w = math.exp(-self.decay * slot.count)
            slot.total += w * actions[index]
            slot.weight += w
            slot.count += 1
            slot.source = CommandSource(chunk, index, policy_version, slot.count)
        return max(0, start + self.horizon - first)

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
