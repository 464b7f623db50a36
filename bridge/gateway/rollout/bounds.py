"""The action bounds the gate judges a policy's candidates against, from who declared them.

    bounds = DeclaredBounds()
    bounds.declare("hopper", action_spec, identity="robot:arm_1")              # a proven identity
    bounds.declare("hopper", action_spec, identity=None, source="ipv4:10.0.0.7 mujoco:Hopper-v5")  # open access
    bounds.specs("hopper")        # the declarations the gate merges (bridge.gate.with_bounds: the tightest)

Sessions declare bounds in their Hello (checked there: finite, low <= high, the right count). What
the gate uses must not be chosen by whoever connects last:

- a *proven* identity (a token or client certificate: "robot:arm_1") keeps its newest declaration,
  one per identity; up to `max_identities` identities per policy (past it the oldest identity's is
  dropped: there are only as many identities as credentials issued);
- without credentials (open access, or an exposed gateway with none configured), a declaration is
  kept per (network peer, declared source), the first `max_anonymous` per policy only: once full, a
  new key is ignored (counted in `ignored`), so a flood of fresh sources evicts nobody;
- when any proven identity declared bounds for a policy, only proven declarations count: anonymous
  ones never loosen or tighten what authenticated robots declared.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from protos.codec import Spec

log = logging.getLogger("tether.gateway")


class DeclaredBounds:
    """See the module docstring. Called from the event loop only."""

    def __init__(self, *, max_identities: int = 1024, max_anonymous: int = 64):
        self.max_identities, self.max_anonymous = max_identities, max_anonymous
        self._proven: dict[str, dict[str, tuple[Spec, ...]]] = {}     # policy -> identity -> action spec
        self._anonymous: dict[str, dict[str, tuple[Spec, ...]]] = {}  # policy -> peer+source -> action spec
        self.ignored = 0  # anonymous declarations past a full table

    def declare(self, policy: str, action_spec: Sequence[Spec], *, identity: str | None,
                source: str = "") -> None:
        """Record one session's declared action spec: under its proven `identity`, else under `source`."""
        specs = tuple(s for s in action_spec if s.low or s.high)
        if not specs:
            return
        if identity is not None:
            known = self._proven.setdefault(policy, {})
            known.pop(identity, None)
            known[identity] = specs
            while len(known) > self.max_identities:
                known.pop(next(iter(known)))
            return
        known = self._anonymous.setdefault(policy, {})
        if source in known or len(known) < self.max_anonymous:
            known[source] = specs
            return
        self.ignored += 1
        if self.ignored == 1 or self.ignored % 1000 == 0:
            log.warning("policy %s: the gate keeps the bounds of the first %d anonymous sources; %d later "
                        "declarations ignored (give robots credentials: their bounds always count)",
                        policy, self.max_anonymous, self.ignored)

    def specs(self, policy: str) -> list[tuple[Spec, ...]]:
        """The declarations the gate merges for `policy`: the proven ones if any, else the anonymous ones."""
        proven = self._proven.get(policy)
        return list((proven or self._anonymous.get(policy) or {}).values())
