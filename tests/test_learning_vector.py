"""The learning loop from a vectorised session: one stream of N MuJoCo envs (a gymnasium `SyncVectorEnv`) ->
gateway -> Triton, each env's transitions logged as `<session>/<i>` -> a 2-rank PPO trainer building per-env
trajectories -> Policies.Publish -> new versions served -> the envs act with them. InvertedPendulum-v5 with 8 envs
in one session must reach an average return of TARGET (the last 20 episodes) within LIMIT_S (tests/support/learning.py).
Measured on this 2-core machine at load 8-9 (2026-12-01, three runs): 500 after 22-32 s at 890-1120 env steps/s, the
whole test 47-62 s.
This is the suite's `tether demo --train` check; PPO from single-env sessions reaching 500 is shown by
tests/fleet/test_all_together.py (with a gateway killed on the way)."""

from __future__ import annotations

import itertools

import pytest

from bridge.experience import read_transitions
from tests.support.learning import ENVS, TARGET, learn

pytestmark = pytest.mark.slow


@pytest.mark.timeout(480)
def test_ppo_through_the_loop_from_a_vectorised_session_reaches_its_target(tmp_path):
    summary, curve = learn(tmp_path)
    reached = next((p for p in summary["curve"] if p["return"] is not None and p["return"] >= TARGET), None)
    assert reached is not None, f"return stayed below {TARGET} ({summary['steps_per_s']} env steps/s):\n{curve}"
    assert summary["sessions"] == 1 and summary["envs_per_session"] == ENVS
    assert max(int(v) for v in summary["policy_versions"]) >= 2, "no published version went live"
    trainer_log = (tmp_path / "trainer.log").read_text()
    assert "published" in trainer_log and "lag" in trainer_log
    gateway_log = (tmp_path / "gateway.log").read_text()
    assert "vector session" in gateway_log and "Traceback" not in gateway_log
    keys = {t.session for t in itertools.islice(read_transitions(tmp_path / "experience"), 5000)}
    assert len(keys) == ENVS and all("/" in k for k in keys), keys   # per-env keys `<session>/<i>`
