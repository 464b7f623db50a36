"""The per-session step bookkeeping both experience logs keep (`ExperienceLog`, `JetStreamLog`).

    >>> steps = SessionSteps()
    >>> steps._last_step["robot-1"] = 7
    >>> steps.last_step("robot-1"), steps.durable_step("robot-1"), steps.degraded
    (7, None, None)
    >>> steps.forget("robot-1"); steps.last_step("robot-1") is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType


class SessionSteps:
    """Each session's highest appended and durable step, the sessions refused at the bound, and why
    nothing becomes durable now (`degraded`); the log that subclasses it updates them."""

    def __init__(self) -> None:
        self._last_step: dict[str, int] = {}     # highest step appended per session
        self._durable_step: dict[str, int] = {}  # highest step durable per session
        self._refusing: dict[str, int] = {}      # session -> its first step refused at the bound (until resume)
        self._degraded: str | None = None

    def resume(self, session: str) -> None:
        """The session connected again: after a refusal at the bound its transitions are taken again
        (from the step after its last appended one: the client replays the refused ones)."""
        self._refusing.pop(session, None)

    def forget(self, session: str) -> None:
        """What this log holds of `session` is not the session's history any more (another gateway owned it
        since, bridge.gateway.session.owners): its steps are taken again from any step (the client replays
        them under the new epoch), and its `durable_step` restarts from what this epoch acknowledges."""
        self._last_step.pop(session, None)
        self._durable_step.pop(session, None)
        self._refusing.pop(session, None)

    def last_step(self, session: str) -> int | None:
        """The highest step appended for `session` (durable or queued), None if it has none."""
        return self._last_step.get(session)

    def durable_step(self, session: str) -> int | None:
        """The highest step of `session` that is durable: every step of it below is too, since a
        session's steps are appended in order and become durable in order."""
        return self._durable_step.get(session)

    @property
    def durable_steps(self) -> Mapping[str, int]:
        """Every session's `durable_step` (read-only view; a vector session's envs read it in one pass)."""
        return MappingProxyType(self._durable_step)

    @property
    def degraded(self) -> str | None:
        """None while transitions become durable; else why not (the log keeps retrying)."""
        return self._degraded
