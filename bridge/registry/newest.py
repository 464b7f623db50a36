"""The newest version per policy, and how far the sessions acting lag it: one definition for the metrics
(`tether_policy_lag_versions`), the console's fleet figures and the rollout's freshness.

    newest = newest_versions(registry, acting=[("hopper", 3), ("hopper", 5)])   # {"hopper": 7, ...}
    lags = version_lags(newest, acting)                                           # {"hopper": 4, ...}

    >>> version_lags(newest_versions(None, [("hopper", 3), ("hopper", 5), ("ant", 2)]), [("hopper", 3), ("ant", 2)])
    {'hopper': 2, 'ant': 0}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from bridge.registry.model import State, VersionRecord

__all__ = ["VersionSource", "newest_record", "newest_versions", "version_lags"]


class VersionSource(Protocol):
    """What reading versions needs of a registry (bridge.registry.Registry is one)."""

    def policies(self) -> list[str]: ...

    def versions(self, policy: str) -> list[VersionRecord]: ...


def newest_record(records: Iterable[VersionRecord], *, rejected: bool = True) -> VersionRecord | None:
    """The highest-numbered of `records` (rejected ones skipped unless `rejected`), or None."""
    return max((r for r in records if rejected or r.state is not State.REJECTED), key=lambda r: r.version,
               default=None)


def newest_versions(registry: VersionSource | None, acting: Iterable[tuple[str, int]] = (), *,
                    policies: Iterable[str] | None = None, rejected: bool = True) -> dict[str, int]:
    """Per policy, the newest version: the highest the registry holds for it (`policies`: all of the registry's,
    and those acting) or that a session acts with, whichever is higher."""
    acting = list(acting)
    newest: dict[str, int] = {}
    for policy, version in acting:
        newest[policy] = max(newest.get(policy, version), version)
    if registry is not None:
        names = registry.policies() if policies is None else policies
        for policy in dict.fromkeys([*names, *newest]):
            record = newest_record(registry.versions(policy), rejected=rejected)
            if record is not None:
                newest[policy] = max(newest.get(policy, record.version), record.version)
    return newest


def version_lags(newest: dict[str, int], acting: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Per policy of `newest`: newest minus the oldest version a session acts with (0 with none acting)."""
    oldest: dict[str, int] = {}
    for policy, version in acting:
        oldest[policy] = min(oldest.get(policy, version), version)
    return {policy: max(0, top - oldest.get(policy, top)) for policy, top in newest.items()}
