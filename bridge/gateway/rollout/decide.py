"""The rollout's judgement, as a pure function: a policy's rollout (who is live, canary, shadow), what the
sessions showed (the RegressionMonitor's verdicts, the counts) and the plan -> the next move and why.
No I/O, no clock, no lock: the controller gathers the figures, calls `decide`, and carries the move out.

    move = decide(rollout, Observed(canary=monitor.verdict(4, 3), canary_episodes=12), plan=plan, probation=None)
    if move.action is Action.ROLL_BACK: await controller.rollback(policy, move.version, who="auto", why=move.why)

>>> from bridge.registry import Rollout, Verdict
>>> from bridge.gateway.rollout.config import RolloutPlan
>>> r = Rollout("hopper", live=3, previous_live=2, shadow=None, canary=4, canary_fraction=0.25)
>>> decide(r, Observed(canary=Verdict(True, "error rate 0.2 > 0.01")), plan=RolloutPlan(mode="staged"))
Move(action=<Action.ROLL_BACK: 'roll_back'>, version=4, why='canary regressed: error rate 0.2 > 0.01')
>>> decide(r, Observed(canary=Verdict(False, "v4 within thresholds vs v3"), canary_episodes=10),
...        plan=RolloutPlan(mode="staged")).action
<Action.GO_LIVE: 'go_live'>

The rules, in order (the first that applies wins):
1. a canary that regressed against the live version is rolled back (in either mode);
2. staged: a canary judged fine after `plan.canary_episodes` episodes goes live (and is on probation);
3. staged: the live version on probation (promoted by the plan or an operator, not restored by a rollback)
   that regressed against the previous live version is rolled back;
4. staged: a shadow with `plan.shadow_steps` compared steps, while no canary runs, becomes the canary;
5. otherwise hold (the controller unloads what nobody needs).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from bridge.gateway.rollout.config import RolloutPlan
from bridge.registry import Rollout, Verdict


class Action(enum.StrEnum):
    ROLL_BACK = "roll_back"      # move `version` to rolled_back (the live one: the previous live is back)
    GO_LIVE = "go_live"          # the canary `version` becomes live, on probation
    START_CANARY = "start_canary"  # the shadow `version` becomes the canary, with the plan's fraction/labels
    HOLD = "hold"                # nothing changes; `why` says what is awaited


@dataclass(frozen=True, kw_only=True)
class Observed:
    """What the sessions showed. canary: the canary's verdict vs the live version (None: no canary or no live);
    live: the live version's verdict vs the previous live one (None: no previous live); the counts come from
    the per-version stats (bridge.gateway.rollout.stats)."""

    canary: Verdict | None = None
    live: Verdict | None = None
    canary_episodes: int = 0
    shadow_steps: int = 0
    shadow_divergence: float = 0.0


@dataclass(frozen=True)
class Move:
    action: Action
    version: int | None
    why: str  # the audit's why for a change; for HOLD, what the rollout waits for


def decide(rollout: Rollout, observed: Observed, *, plan: RolloutPlan, probation: int | None = None) -> Move:
    """The next move for `rollout` (see the module docstring). `probation`: the live version that is judged
    against the previous live one (the one the plan or an operator promoted; None: none is)."""
    r, staged = rollout, plan.mode == "staged"
    waiting: list[str] = []
    if r.canary is not None and r.live is not None and observed.canary is not None:
        verdict = observed.canary
        if verdict.regressed:
            return Move(Action.ROLL_BACK, r.canary, f"canary regressed: {verdict.reason}")
        episodes = observed.canary_episodes
        if staged and episodes >= plan.canary_episodes and verdict.judged:
            return Move(Action.GO_LIVE, r.canary, f"canary: {episodes} episodes, {verdict.reason}")
        waiting.append(f"canary v{r.canary}: {episodes}/{plan.canary_episodes} episodes, {verdict.reason}"
                       if staged else f"canary v{r.canary}: rollout direct, an operator promotes it")
    if staged and r.live is not None and r.live == probation and r.previous_live is not None \
            and observed.live is not None:
        if observed.live.regressed:
            return Move(Action.ROLL_BACK, r.live, f"live regressed: {observed.live.reason}")
        waiting.append(f"live v{r.live} on probation: {observed.live.reason}")
    if staged and r.shadow is not None and r.canary is None:
        if observed.shadow_steps >= plan.shadow_steps:
            return Move(Action.START_CANARY, r.shadow,
                        f"shadow: {observed.shadow_steps} steps, mean action divergence "
                        f"{observed.shadow_divergence:.4g}")
        waiting.append(f"shadow v{r.shadow}: {observed.shadow_steps}/{plan.shadow_steps} steps")
    return Move(Action.HOLD, None, "; ".join(waiting) or "nothing to judge")
