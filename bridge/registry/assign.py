"""Which version a session acts with, from a Rollout alone (pure: same answer in every process and after restarts).

    rollout = registry.rollout("hopper")
    version = assign(rollout, "arm_2/0", {"robot": "arm_2"})     # pins, then canary, then live
    shadow = shadow_of(rollout)                                    # also infer this one, never actuate it

>>> from bridge.registry import Rollout
>>> r = Rollout("p", live=1, previous_live=None, shadow=None, canary=2, canary_fraction=0.0,
...             canary_labels={"robot": "arm_2"}, pins={"session=s9": 1})
>>> assign(r, "s1", {"robot": "arm_2"}), assign(r, "s1", {"robot": "arm_1"}), assign(r, "s9", {"robot": "arm_2"})
(2, 1, 1)
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from bridge.common.kv import parse_pairs  # pure too: the standard library only

if TYPE_CHECKING:  # pure: this file needs nothing at run time but the standard library and bridge.common
    from bridge.registry.model import Rollout


def assign(rollout: Rollout, session_id: str, labels: Mapping[str, str]) -> int | None:
    """The version for a session: its session pin, else a pin on one of its labels (the first by selector), else
    the canary if the session is in it, else the live version (None when the policy has none)."""
    pinned = rollout.pins.get(f"session={session_id}")
    if pinned is not None:
        return pinned
    for selector in sorted(f"{k}={v}" for k, v in labels.items() if "=" not in k):  # pins split at the first "="
        if selector in rollout.pins:
            return rollout.pins[selector]
    return rollout.canary if rollout.canary is not None and in_canary(rollout, session_id, labels) else rollout.live


def in_canary(rollout: Rollout, session_id: str, labels: Mapping[str, str]) -> bool:
    """With canary labels: the session has all of them. Else: its stable hash is below the canary fraction (so
    raising the fraction only adds sessions)."""
    if rollout.canary_labels:
        return all(labels.get(k) == v for k, v in rollout.canary_labels.items())
    return session_hash(rollout.policy, session_id) < rollout.canary_fraction


def session_hash(policy: str, session_id: str) -> float:
    """A session's place in [0, 1) for `policy`: sha256-based, the same in every process and run.

    >>> session_hash("hopper", "s1") == session_hash("hopper", "s1") and 0 <= session_hash("hopper", "s1") < 1
    True
    """
    digest = hashlib.sha256(f"{policy}\0{session_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def shadow_of(rollout: Rollout) -> int | None:
    """The version to infer beside the acting one (its actions compared, never actuated), or None."""
    return rollout.shadow


def parse_labels(text: str) -> dict[str, str]:
    """Labels as the command line writes them, K=V[,K=V] (canary labels, label pins): bridge.common.kv.

    >>> parse_labels("robot=arm_2,site=lab")
    {'robot': 'arm_2', 'site': 'lab'}
    """
    return parse_pairs(text, what="label")
