"""A person's command on the edge (teleop: a joystick, a leader arm): the latest message of the topic map's
intervention topic, and whether it still holds. A dead man's switch: the override holds while messages keep
arriving within `hold_s` of each other and ends by itself `hold_s` after the last one.

    >>> teleop = Teleop(hold_s=0.02)
    >>> teleop.held(now=0.0) is None                       # nobody has stepped in
    True
    >>> teleop.received("cmd-1", now=1.000)                # the transport's receive thread
    >>> teleop.held(now=1.015), teleop.held(now=1.021)     # the control thread, every period
    ('cmd-1', None)

The edge node (`bridge.ros2.node`) publishes the held command through the same `SafetyGuard` as the policy's
actions (clamp, rate limit, and an e-stop latch that a person's command never overrides), reports it as the
next observation's `applied_action` with `intervention=True`, and keeps asking the policy every step: the log
holds the policy's own action beside the person's.
"""

from __future__ import annotations

import math
import threading

__all__ = ["Teleop"]


class Teleop:
    """The latest intervention message and when it came (thread-safe: one writer, any readers)."""

    def __init__(self, *, hold_s: float):
        if isinstance(hold_s, bool) or not isinstance(hold_s, int | float) or not math.isfinite(hold_s) or hold_s <= 0:
            raise ValueError(f"hold_s: expected seconds > 0, got {hold_s!r}")
        self.hold_s = float(hold_s)
        self._lock = threading.Lock()
        self._msg: object | None = None
        self._t = -math.inf
        self.messages = 0              # received so far

    def received(self, msg: object, *, now: float) -> None:
        with self._lock:
            self._msg, self._t = msg, now
            self.messages += 1

    def held(self, *, now: float) -> object | None:
        """The person's latest message while the override holds (the last one came within `hold_s`), else None."""
        with self._lock:
            return self._msg if now - self._t <= self.hold_s else None
