"""The rollout's pure decision (bridge.gateway.rollout_decide.decide): a table of cases, one per rule and per
boundary, then every combination of slots, verdicts, counts, modes and probation checked against the rules."""

from __future__ import annotations

import itertools

import pytest

from bridge.gateway.rollout.config import RolloutPlan
from bridge.gateway.rollout.decide import Action, Move, Observed, decide
from bridge.registry import Rollout, Verdict

STAGED = RolloutPlan(mode="staged", shadow_steps=10, canary_episodes=4)
DIRECT = RolloutPlan(mode="direct", shadow_steps=10, canary_episodes=4)
BAD = Verdict(True, "error rate 0.5 > 0.01")
FINE = Verdict(False, "v4 within thresholds vs v3")
EARLY = Verdict(False, "not judged yet: v4 has 1/5 episodes", judged=False)


def rollout(*, live=3, previous=2, shadow=None, canary=None) -> Rollout:
    return Rollout("hopper", live, previous, shadow, canary, 0.25)


CASES = [
    # (id, rollout, observed, plan, probation, expected move)
    ("regressed canary rolls back", rollout(canary=4), Observed(canary=BAD, canary_episodes=9), STAGED, None,
     Move(Action.ROLL_BACK, 4, "canary regressed: error rate 0.5 > 0.01")),
    ("regressed canary rolls back in direct mode too", rollout(canary=4), Observed(canary=BAD), DIRECT, None,
     Move(Action.ROLL_BACK, 4, "canary regressed: error rate 0.5 > 0.01")),
    ("canary with its episodes goes live", rollout(canary=4), Observed(canary=FINE, canary_episodes=4), STAGED, None,
     Move(Action.GO_LIVE, 4, "canary: 4 episodes, v4 within thresholds vs v3")),
    ("canary one episode short holds", rollout(canary=4), Observed(canary=FINE, canary_episodes=3), STAGED, None,
     Move(Action.HOLD, None, "canary v4: 3/4 episodes, v4 within thresholds vs v3")),
    ("canary not judged yet holds, whatever its episodes", rollout(canary=4),
     Observed(canary=EARLY, canary_episodes=40), STAGED, None,
     Move(Action.HOLD, None, "canary v4: 40/4 episodes, not judged yet: v4 has 1/5 episodes")),
    ("direct mode never promotes a canary", rollout(canary=4), Observed(canary=FINE, canary_episodes=99), DIRECT,
     None, Move(Action.HOLD, None, "canary v4: rollout direct, an operator promotes it")),
    ("canary without a live version is not judged", rollout(live=None, previous=None, canary=4),
     Observed(canary=BAD, canary_episodes=9), STAGED, None, Move(Action.HOLD, None, "nothing to judge")),
    ("live on probation that regressed rolls back", rollout(), Observed(live=BAD), STAGED, 3,
     Move(Action.ROLL_BACK, 3, "live regressed: error rate 0.5 > 0.01")),
    ("live on probation within thresholds holds", rollout(), Observed(live=FINE), STAGED, 3,
     Move(Action.HOLD, None, "live v3 on probation: v4 within thresholds vs v3")),
    ("live restored by a rollback is not judged", rollout(), Observed(live=BAD), STAGED, 4,
     Move(Action.HOLD, None, "nothing to judge")),
    ("live without a previous live is not judged", rollout(previous=None), Observed(live=BAD), STAGED, 3,
     Move(Action.HOLD, None, "nothing to judge")),
    ("direct mode does not judge live", rollout(), Observed(live=BAD), DIRECT, 3,
     Move(Action.HOLD, None, "nothing to judge")),
    ("canary regression comes before live regression", rollout(canary=4), Observed(canary=BAD, live=BAD), STAGED, 3,
     Move(Action.ROLL_BACK, 4, "canary regressed: error rate 0.5 > 0.01")),
    ("canary going live comes before live regression", rollout(canary=4),
     Observed(canary=FINE, canary_episodes=4, live=BAD), STAGED, 3,
     Move(Action.GO_LIVE, 4, "canary: 4 episodes, v4 within thresholds vs v3")),
    ("a waiting canary does not shield a regressed live", rollout(canary=4),
     Observed(canary=FINE, canary_episodes=1, live=BAD), STAGED, 3,
     Move(Action.ROLL_BACK, 3, "live regressed: error rate 0.5 > 0.01")),
    ("shadow with its steps becomes the canary", rollout(shadow=5), Observed(shadow_steps=10, shadow_divergence=0.125),
     STAGED, None, Move(Action.START_CANARY, 5, "shadow: 10 steps, mean action divergence 0.125")),
    ("shadow one step short holds", rollout(shadow=5), Observed(shadow_steps=9), STAGED, None,
     Move(Action.HOLD, None, "shadow v5: 9/10 steps")),
    ("shadow waits while a canary runs", rollout(shadow=5, canary=4), Observed(canary=FINE, shadow_steps=99),
     STAGED, None, Move(Action.HOLD, None, "canary v4: 0/4 episodes, v4 within thresholds vs v3")),
    ("direct mode leaves a shadow where it is", rollout(shadow=5), Observed(shadow_steps=99), DIRECT, None,
     Move(Action.HOLD, None, "nothing to judge")),
    ("a shadow with no live version still advances", rollout(live=None, previous=None, shadow=5),
     Observed(shadow_steps=10), STAGED, None,
     Move(Action.START_CANARY, 5, "shadow: 10 steps, mean action divergence 0")),
    ("zero thresholds: an unobserved shadow advances", rollout(shadow=5), Observed(),
     RolloutPlan(mode="staged", shadow_steps=0), None, Move(Action.START_CANARY, 5,
                                                            "shadow: 0 steps, mean action divergence 0")),
    ("empty rollout holds", rollout(live=None, previous=None), Observed(), STAGED, None,
     Move(Action.HOLD, None, "nothing to judge")),
]


@pytest.mark.parametrize(("r", "observed", "plan", "probation", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_decide_table(r, observed, plan, probation, expected):
    assert decide(r, observed, plan=plan, probation=probation) == expected


SLOTS = [None, 3, 4]
VERDICTS = [None, BAD, FINE, EARLY]


def _combinations():
    for live, previous, shadow, canary, probation in itertools.product(SLOTS, SLOTS, [None, 5], [None, 4], SLOTS):
        if previous is not None and previous == live or canary is not None and canary == live:
            continue  # one version holds one slot
        for cv, lv, episodes, steps, plan in itertools.product(VERDICTS, VERDICTS, (0, 4), (0, 10), (STAGED, DIRECT)):
            yield (Rollout("p", live, previous, shadow, canary, 0.25),
                   Observed(canary=cv, live=lv, canary_episodes=episodes, shadow_steps=steps), plan, probation)


def test_every_combination_follows_the_rules_in_order():
    """Each of 9216 inputs: the move is the first rule that applies (module docstring), else a hold."""
    seen = set()
    for r, o, plan, probation in _combinations():
        move = decide(r, o, plan=plan, probation=probation)
        staged = plan.mode == "staged"
        canary_judged = r.canary is not None and r.live is not None and o.canary is not None
        if canary_judged and o.canary.regressed:
            expected = (Action.ROLL_BACK, r.canary)
        elif canary_judged and staged and o.canary.judged and o.canary_episodes >= plan.canary_episodes:
            expected = (Action.GO_LIVE, r.canary)
        elif staged and r.live is not None and r.live == probation and r.previous_live is not None \
                and o.live is not None and o.live.regressed:
            expected = (Action.ROLL_BACK, r.live)
        elif staged and r.shadow is not None and r.canary is None and o.shadow_steps >= plan.shadow_steps:
            expected = (Action.START_CANARY, r.shadow)
        else:
            expected = (Action.HOLD, None)
        assert (move.action, move.version) == expected, (r, o, plan.mode, probation, move)
        assert move.why, (r, o, move)
        seen.add(move.action)
    assert seen == set(Action)  # the table reached every move


def test_decide_is_pure_the_same_inputs_give_the_same_move_and_nothing_is_changed():
    r, o = rollout(canary=4), Observed(canary=FINE, canary_episodes=4)
    before = (r, o, STAGED)
    assert decide(r, o, plan=STAGED) == decide(r, o, plan=STAGED)
    assert (r, o, STAGED) == before
