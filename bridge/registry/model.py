"""The registry's vocabulary: states, the legal moves between them, and the records it returns."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class State(enum.StrEnum):
    CANDIDATE = "candidate"
    GATED = "gated"
    SHADOW = "shadow"
    CANARY = "canary"
    LIVE = "live"
    RETIRED = "retired"
    REJECTED = "rejected"
    ROLLED_BACK = "rolled_back"


S = State
MOVES: dict[State, frozenset[State]] = {
    S.CANDIDATE: frozenset({S.GATED, S.REJECTED}),
    S.GATED: frozenset({S.SHADOW, S.CANARY, S.LIVE, S.REJECTED}),
    S.SHADOW: frozenset({S.CANARY, S.LIVE, S.ROLLED_BACK, S.RETIRED}),
    S.CANARY: frozenset({S.LIVE, S.ROLLED_BACK, S.RETIRED}),
    S.LIVE: frozenset({S.ROLLED_BACK, S.RETIRED}),
    S.RETIRED: frozenset({S.LIVE}),
    S.REJECTED: frozenset(),
    S.ROLLED_BACK: frozenset(),
}
"""Legal moves: `MOVES[from_state]` is the set of states `Registry.move` accepts from it."""

SLOTS = (S.LIVE, S.CANARY, S.SHADOW)  # at most one version of a policy in each of these states
WITHDRAWN = frozenset({S.REJECTED, S.ROLLED_BACK})  # never served again, never pinned


def move_refused(policy: str, version: int, state: State, to: State, *, previous_live: int | None) -> str | None:
    """Why `version` (now `state`) may not move to `to`, or None when it may: the one place the rules are checked
    (the registry's `move`, and the gateway's rollout before it loads anything). `previous_live`: the version a
    move of the live one away would restore (a live version without one may not leave).

    >>> move_refused("hopper", 4, State.REJECTED, State.LIVE, previous_live=3)
    "policy 'hopper' v4 is rejected; it may not move to live (allowed: nothing: it is final)"
    >>> move_refused("hopper", 4, State.CANARY, State.LIVE, previous_live=3) is None
    True
    """
    if to not in MOVES[state]:
        allowed = ", ".join(sorted(MOVES[state])) or "nothing: it is final"
        return f"policy {policy!r} v{version} is {state}; it may not move to {to} (allowed: {allowed})"
    if state is S.LIVE and previous_live is None:
        return (f"policy {policy!r} v{version} is live and there is no previous live version to restore, so it may "
                f"not move to {to}; promote another version to live instead")
    return None


@dataclass(frozen=True)
class VersionRecord:
    policy: str
    version: int
    sha256: str
    format: str
    state: State
    lineage: dict
    inputs: list[dict]
    outputs: list[dict]
    gate: list[dict]  # every gate check recorded so far: {"name", "passed", "figures", "detail", ...}
    created_ns: int
    updated_ns: int

    @property
    def gate_passed(self) -> bool | None:
        """None before any check was recorded, else whether every recorded check passed."""
        return all(c["passed"] for c in self.gate) if self.gate else None


@dataclass(frozen=True)
class Event:
    """One audit event. kind "state": from_state -> to_state of `version`; "gate": a gate run (state unchanged,
    figures "<check>.<figure>"); "canary": the canary setting (from/to: the fraction); "pin": from/to the pinned
    version ("v3", or "" for none), the selector in `detail`."""

    id: int
    t_ns: int
    policy: str
    version: int | None
    kind: str
    from_state: str
    to_state: str
    who: str
    why: str
    figures: dict
    detail: str = ""


@dataclass(frozen=True)
class Rollout:
    """Who is where for one policy. pins: selector ("session=<id>" or a label "<key>=<value>") -> version."""

    policy: str
    live: int | None
    previous_live: int | None
    shadow: int | None
    canary: int | None
    canary_fraction: float
    canary_labels: dict[str, str] = field(default_factory=dict)
    pins: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class EStopRecord:
    """One operator e-stop. target: "all", "session=<id>" or "robot=<name>"; id: "estop-<n>-<nonce>", unique across
    restarts (and across a re-created registry file). Standing while released_ns is None; at most one standing per
    target. Its audit events (kind "estop"/"release") carry the target in `detail` and the id in to/from_state."""

    id: str
    target: str
    who: str
    why: str
    t_ns: int
    released_ns: int | None = None
    released_by: str = ""
    released_why: str = ""

    @property
    def standing(self) -> bool:
        return self.released_ns is None
