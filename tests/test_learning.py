"""The whole learning loop on real components: MuJoCo sims -> gateway -> Triton, every transition
logged -> Experience stream -> a 2-rank PPO trainer under torchrun -> Policies.Publish -> new
versions verified and served by Triton -> the sims act with them. InvertedPendulum-v5 must reach
an average return of 500 within 5 minutes on this 2-core machine."""

from __future__ import annotations

import json

import pytest

from tether.topology import DemoConfig, run_demo

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_ppo_through_the_loop_reaches_500_on_inverted_pendulum_within_5_minutes(tmp_path):
    summary = run_demo(DemoConfig(env="InvertedPendulum-v5", envs=8, seconds=300, run_dir=tmp_path, train=True,
                                  stop_at_return=500.0))
    (tmp_path / "learning.json").write_text(json.dumps(summary))
    curve = [f"{p['seconds']:.0f}s {p['steps']} steps return {p['return']} v{p['version']}"
             for p in summary["curve"][::10]]
    assert summary["seconds_to_500"] is not None, (f"return stayed below 500 ({summary['steps_per_s']} env steps/s):\n"
                                                   + "\n".join(curve))
    assert summary["seconds_to_500"] <= 300
    versions = [int(v) for v in summary["policy_versions"]]
    assert max(versions) >= 2, "no published version went live"
    trainer_log = (tmp_path / "trainer.log").read_text()
    assert "published" in trainer_log and "lag" in trainer_log   # lag figures are logged per batch
    gateway_log = (tmp_path / "gateway.log").read_text()
    assert "published" in gateway_log and "Traceback" not in gateway_log
