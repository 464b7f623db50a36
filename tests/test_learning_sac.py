"""Off-policy learning through the whole loop: MuJoCo envs (one vectorised session) -> gateway -> Triton, every
transition logged -> Experience.Subscribe -> `tether train --algo sac` (one rank: replay buffer, twin critics)
-> Policies.Publish through the gate -> new versions served -> the envs act with them. InvertedPendulum-v5 must
reach an average return of TARGET (the last 20 episodes) within LIMIT_S (tests/support/learning.py); the run stops
there. Measured on this 2-core machine at load 5-10 (2026-12-01, four runs): 500 after 51-116 s (66-98k env steps,
4.3-5.2k updates), the whole test 63-145 s."""

from __future__ import annotations

import re

import pytest

from tests.support.learning import TARGET, learn

pytestmark = pytest.mark.slow


@pytest.mark.timeout(420)
def test_sac_through_the_loop_reaches_500_on_inverted_pendulum(tmp_path):
    summary, curve = learn(tmp_path, algo="sac")
    assert summary["seconds_to_500"] is not None, (f"return stayed below {TARGET} ({summary['steps_per_s']} env "
                                                   f"steps/s):\n{curve}")
    trainer_log = (tmp_path / "trainer.log").read_text()
    assert "[trainer] sac:" in trainer_log
    assert "Traceback" not in trainer_log.split("SIGTERM", 1)[0]   # until the demo stops it at the target
    parents = [int(p) for p in re.findall(r"published \S+ v\d+ \(parent v(\d+)", trainer_log)]
    assert parents and parents[0] == 1 and parents == sorted(parents)     # SAC versions, each on the newest
    assert max(int(v) for v in summary["policy_versions"]) >= 2, "no SAC version went live"
    gateway_log = (tmp_path / "gateway.log").read_text()
    assert "Traceback" not in gateway_log
    print(f"SAC: return >= {TARGET} after {summary['seconds_to_500']} s, {summary['steps_to_500']} env steps")
