"""Shared helpers for the registry tests: a registry with v1 serving, and a way to bring a version to any state."""

from __future__ import annotations

import hashlib

from bridge.registry import Registry, State

POLICY = "hopper"


def digest(version: int) -> str:
    return hashlib.sha256(f"weights v{version}".encode()).hexdigest()


def add(registry: Registry, version: int, *, state: State = State.CANDIDATE, policy: str = POLICY,
        who: str = "trainer:0"):
    return registry.add(policy, version, sha256=digest(version), format="safetensors",
                        lineage={"parent": version - 1, "trainer_step": 100 * version},
                        inputs=[{"name": "observation", "dtype": "float32", "shape": [11]}],
                        outputs=[{"name": "action", "dtype": "float32", "shape": [3]}], who=who, state=state)


def serving(registry: Registry) -> Registry:
    """v1 registered as live, as the gateway does for the version Triton serves at start."""
    registry.add(POLICY, 1, sha256=digest(1), format="safetensors", lineage={}, inputs=[], outputs=[],
                 who="gateway", why="serving at start", state=State.LIVE)
    return registry


def reach(registry: Registry, state: State) -> int:
    """Bring a version to `state` through legal moves only (v1 is live already); returns that version."""
    move = registry.move
    if state is State.RETIRED:  # v2 goes live, so v1 retires
        add(registry, 2)
        move(POLICY, 2, State.GATED, who="gate", why="passed")
        move(POLICY, 2, State.LIVE, who="operator:alice", why="promote")
        return 1
    add(registry, 2)
    path = {
        State.CANDIDATE: [],
        State.GATED: [State.GATED],
        State.SHADOW: [State.GATED, State.SHADOW],
        State.CANARY: [State.GATED, State.CANARY],
        State.LIVE: [State.GATED, State.LIVE],
        State.REJECTED: [State.REJECTED],
        State.ROLLED_BACK: [State.GATED, State.CANARY, State.ROLLED_BACK],
    }[state]
    for step in path:
        move(POLICY, 2, step, who="auto", why=f"to {step}")
    return 2
