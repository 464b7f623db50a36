"""The policy registry: versions, states, gate results, rollout (live / shadow / canary / pins) and the audit log,
in one SQLite file or a PostgreSQL database gateways share; which version each session gets; when a canary or live
version has regressed.

    registry = Registry(run_dir / "registry.sqlite")                 # or Registry("postgresql://...")
    registry.add(policy, version, sha256=..., format="safetensors", lineage=..., inputs=..., outputs=..., who=...)
    registry.move(policy, version, State.LIVE, who="operator:alice", why="looks good")
    version = assign(registry.rollout(policy), session_id, labels)
"""

from bridge.registry.assign import assign, in_canary, parse_labels, session_hash, shadow_of
from bridge.registry.backends import connect, is_url
from bridge.registry.errors import (
    DuplicateVersion,
    RegistryError,
    RegistryUnavailable,
    RegistryWriteFailed,
    UnknownVersion,
)
from bridge.registry.model import MOVES, WITHDRAWN, EStopRecord, Event, Rollout, State, VersionRecord, move_refused
from bridge.registry.monitor import RegressionMonitor, Thresholds, Verdict
from bridge.registry.store import Registry

__all__ = ["MOVES", "DuplicateVersion", "EStopRecord", "Event", "RegistryError", "RegistryUnavailable",
           "RegistryWriteFailed", "Registry", "RegressionMonitor", "Rollout", "State", "Thresholds", "UnknownVersion",
           "Verdict", "VersionRecord", "WITHDRAWN", "assign", "connect", "in_canary", "is_url", "move_refused",
           "parse_labels", "session_hash", "shadow_of"]
