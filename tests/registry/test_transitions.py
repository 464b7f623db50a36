"""The state machine's rules live once (bridge.registry.model.move_refused): every (state, to) pair is refused
exactly when MOVES says so, a live version without a previous one may not leave, and the registry's refusal is
that function's text, word for word (the gateway's rollout raises the same text before it loads anything)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from bridge.registry import MOVES, Registry, RegistryError, State, move_refused
from tests.registry.helpers import POLICY, reach, serving


@pytest.mark.parametrize(("start", "to"), list(itertools.product(State, State)))
def test_move_refused_follows_the_moves_table(start: State, to: State):
    refused = move_refused("p", 7, start, to, previous_live=6)
    if to in MOVES[start]:
        assert refused is None
    else:
        assert refused is not None and f"v7 is {start}; it may not move to {to}" in refused
        assert (", ".join(sorted(MOVES[start])) or "nothing: it is final") in refused


@pytest.mark.parametrize("to", sorted(MOVES[State.LIVE]))
def test_a_live_version_without_a_previous_one_may_not_leave(to: State):
    assert move_refused("p", 7, State.LIVE, to, previous_live=6) is None
    assert "no previous live version to restore" in move_refused("p", 7, State.LIVE, to, previous_live=None)


@pytest.mark.parametrize(("start", "to"), [(State.REJECTED, State.LIVE), (State.CANDIDATE, State.CANARY),
                                           (State.LIVE, State.CANARY)])
def test_the_registry_refuses_with_the_rules_text(tmp_path: Path, start: State, to: State):
    with Registry(tmp_path / "registry.sqlite") as registry:
        version = reach(serving(registry), start)
        with pytest.raises(RegistryError) as info:
            registry.move(POLICY, version, to, who="operator:bob", why="try")
        assert str(info.value) == move_refused(POLICY, version, start, to, previous_live=1)


def test_the_registry_refuses_to_roll_back_a_live_version_with_nothing_to_restore(tmp_path: Path):
    with Registry(tmp_path / "registry.sqlite") as registry:
        serving(registry)  # v1 live, never a previous one
        with pytest.raises(RegistryError) as info:
            registry.move(POLICY, 1, State.ROLLED_BACK, who="operator:bob", why="try")
        assert str(info.value) == move_refused(POLICY, 1, State.LIVE, State.ROLLED_BACK, previous_live=None)
        assert registry.rollout(POLICY).live == 1
