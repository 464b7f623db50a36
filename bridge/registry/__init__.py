"""The policy registry: versions, states, gate results, rollout (live / shadow / canary / pins) and the audit log,
in one SQLite file; which version each session gets; when a canary or live version has regressed.

    registry = Registry(run_dir / "registry.sqlite")
    registry.add(policy, version, sha256=..., format="safetensors", lineage=..., inputs=..., outputs=..., who=...)
    registry.move(policy, version, State.LIVE, who="operator:alice", why="looks good")
    version = assign(registry.rollout(policy), session_id, labels)
"""

import importlib

from bridge.registry.assign import assign, in_canary, session_hash, shadow_of
from bridge.registry.model import MOVES, Event, Rollout, State, VersionRecord
from bridge.registry.monitor import RegressionMonitor, Thresholds, Verdict

_LATER = {"DuplicateVersion": "errors", "RegistryError": "errors", "UnknownVersion": "errors", "Registry": "store"}


def __getattr__(name: str):
    """Import cycle: the errors subclass bridge.gateway's GatewayError, and the gateway imports this package. When
    this package is imported first, `import bridge.gateway` below runs the gateway's imports, which ask for names
    defined after it; they are served from their modules here (bridge.gateway.errors loads fine by then)."""
    if name in _LATER:
        return getattr(importlib.import_module(f"bridge.registry.{_LATER[name]}"), name)
    raise AttributeError(f"module 'bridge.registry' has no attribute {name!r}")


import bridge.gateway  # noqa: E402, F401  (see __getattr__)
from bridge.registry.errors import DuplicateVersion, RegistryError, UnknownVersion  # noqa: E402
from bridge.registry.store import Registry  # noqa: E402

__all__ = [
    "MOVES",
    "DuplicateVersion",
    "Event",
    "Registry",
    "RegistryError",
    "RegressionMonitor",
    "Rollout",
    "State",
    "Thresholds",
    "UnknownVersion",
    "Verdict",
    "VersionRecord",
    "assign",
    "in_canary",
    "session_hash",
    "shadow_of",
]
