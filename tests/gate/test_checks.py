"""The gate's verdicts without Triton: integrity, output comparison, action sanity, the evaluation rule."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bridge.gate import CheckResult, Gate, GateConfig, GateReport, SimEvaluator
from bridge.gate.checks import action_sanity, compare_outputs, evaluation, integrity
from bridge.gate.evaluation import EvaluationError, _episode_returns
from inference_server import PolicyClient
from protos import policies_pb2
from protos.codec import Spec, encode

ARCH = {"net.0.weight": torch.zeros(8, 4), "net.0.bias": torch.zeros(8), "net.2.weight": torch.zeros(1, 8)}
ACT = (Spec("action", np.float32, (2,), low=(-1.0, -2.0), high=(1.0, 2.0)),)


def test_integrity_passes_matching_finite_weights_and_reports_figures():
    weights = {k: torch.randn(v.shape) for k, v in ARCH.items()}
    data = b"safetensors bytes"
    check = integrity(weights, ARCH, sha256=hashlib.sha256(data).hexdigest(), data=data)
    assert check.passed and check.name == "integrity"
    assert check.figures == {"tensors": 3.0, "sha256_ok": 1.0, "parameters": 48.0, "non_finite": 0.0}


@pytest.mark.parametrize(("change", "named"), [
    ({"net.0.bias": torch.tensor([0.0] * 7 + [float("nan")])}, "weight 'net.0.bias' has 1 non-finite values"),
    ({"net.0.bias": torch.full((8,), float("inf"))}, "weight 'net.0.bias' has 8 non-finite values"),
    ({"net.0.weight": torch.zeros(4, 8)}, "weight 'net.0.weight' has shape [4, 8], the architecture [8, 4]"),
    ({"net.0.weight": torch.zeros(8, 4, dtype=torch.float64)}, "weight 'net.0.weight' has dtype torch.float64"),
    ({"net.9.weight": torch.zeros(1)}, "unexpected tensors ['net.9.weight']"),
])
def test_integrity_names_the_bad_tensor(change, named):
    weights = {**{k: torch.zeros(v.shape) for k, v in ARCH.items()}, **change}
    check = integrity(weights, ARCH)
    assert not check.passed and named in check.detail


def test_integrity_names_missing_tensors_and_a_wrong_digest():
    weights = {"net.0.weight": torch.zeros(8, 4)}
    check = integrity(weights, ARCH, sha256="00" * 32, data=b"x")
    assert not check.passed and check.figures["sha256_ok"] == 0.0
    assert "missing tensors ['net.0.bias', 'net.2.weight']" in check.detail and "sha256 mismatch" in check.detail
    assert Gate(client=None, experience_dir=None, evaluator=None, config=GateConfig()).check_artifact(
        weights, ARCH).detail == check.detail.split("; ", 1)[1]


def test_compare_outputs_uses_the_tolerance_of_the_dtype():
    want = np.array([[1.0, -2.0], [0.0, 4.0]], np.float32)
    close = compare_outputs({"a": want + np.float32(5e-5)}, {"a": want})
    assert close.passed and 4e-5 < close.figures["max_abs_error"] < 6e-5 and close.figures["worst"] <= 1
    off = compare_outputs({"a": want + np.float32(3e-3)}, {"a": want})
    assert not off.passed and "'a'" in off.detail and off.figures["max_abs_error"] == pytest.approx(3e-3, rel=1e-3)
    assert off.figures["max_rel_error"] == pytest.approx(3e-3, rel=1e-2)   # the largest where |want| > atol: 1.0
    half = compare_outputs({"a": (want + np.float32(3e-3)).astype(np.float16)}, {"a": want.astype(np.float16)})
    assert half.passed and half.figures["rtol"] == 1e-2            # float16 is judged at 1e-2
    strict = compare_outputs({"a": want + np.float32(3e-3)}, {"a": want}, atol=1e-2)  # the header's atol
    assert strict.passed and strict.figures["atol"] == 1e-2 and strict.figures["rtol"] == 0


def test_compare_outputs_fails_on_shape_missing_output_and_non_finite():
    want = np.zeros((2, 2), np.float32)
    assert "served shape [2, 3]" in compare_outputs({"a": np.zeros((2, 3), np.float32)}, {"a": want}).detail
    assert "'a' is not served" in compare_outputs({}, {"a": want}).detail
    nan = compare_outputs({"a": np.full((2, 2), np.nan, np.float32)}, {"a": want})
    assert not nan.passed and "not all finite" in nan.detail


def test_action_sanity_bounds_non_finite_and_jerk():
    ok = action_sanity({"action": np.array([[0.5, -2.0], [1.0, 1.9]], np.float32)}, ACT, pairs=[(0, 1)])
    assert ok.passed and ok.figures["samples"] == 2 and ok.figures["max_jerk"] == pytest.approx(0.975)
    out = action_sanity({"action": np.array([[0.5, 0.0], [1.5, 0.0], [0.0, -2.5], [0.0, 0.0]], np.float32)}, ACT)
    assert not out.passed and out.figures["out_of_bounds"] == 0.5 and "leaves its bounds" in out.detail
    nan = action_sanity({"action": np.array([[np.nan, 0.0], [0.0, 0.0]], np.float32)}, ACT)
    assert not nan.passed and nan.figures["non_finite"] == 0.5 and "non-finite" in nan.detail
    jerky = action_sanity({"action": np.array([[-1.0, 0.0], [1.0, 0.0]], np.float32)}, ACT, pairs=[(0, 1)],
                          max_jerk=0.5)
    assert not jerky.passed and jerky.figures["max_jerk"] == 1.0 and "max jerk 1 " in jerky.detail
    unbounded = (Spec("action", np.float32, (2,)),)   # no bounds declared: only finiteness is judged
    free = action_sanity({"action": np.full((3, 2), 1e6, np.float32)}, unbounded)
    assert free.passed and free.figures["bounded"] == 0 and "declares no bounds" in free.detail
    assert ok.figures["bounded"] == 1 and "within bounds" in ok.detail


def test_evaluation_rule_and_its_figures():
    better = evaluation([10, 12], [10, 10], margin=0.1)
    assert better.passed and better.figures["ratio"] == pytest.approx(1.1) and "rule:" in better.detail
    within = evaluation([9.5, 9.5], [10, 10], margin=0.1)
    assert within.passed and within.figures["threshold"] == 9.0
    worse = evaluation([5, 6], [50, 50], margin=0.1)
    assert not worse.passed and "worse than the incumbent" in worse.detail and worse.figures["candidate_std"] == 0.5
    negative = evaluation([-110], [-100], margin=0.05)   # a margin of |incumbent|: -105 is the threshold
    assert not negative.passed and negative.figures["threshold"] == -105
    assert not evaluation([float("nan")], [1.0], margin=0.1).passed
    assert not evaluation([], [1.0], margin=0.1).passed


def test_results_reports_and_config_validate_and_serialise():
    with pytest.raises(ValueError, match="'speed' is not one of"):
        CheckResult("speed", True)
    with pytest.raises(ValueError, match="figures \\['x'\\] are not numbers"):
        CheckResult("integrity", True, {"x": "abc"})
    skipped = CheckResult.skipped("evaluation", "no eval env configured")
    assert skipped.passed and skipped.is_skipped and skipped.figures == {}
    report = GateReport([CheckResult("consistency", False, {"worst": float("inf")}, "off"), skipped])
    assert not report.passed and report.failed == ["consistency"] and report.get("evaluation") is skipped
    assert json.loads(json.dumps(report.to_dict()))["checks"][0]["figures"] == {"worst": "inf"}
    for bad in ({"eval_episodes": 0}, {"eval_margin": -0.1}, {"sanity_samples": 1.5}, {"max_jerk": -1},
                {"tolerances": {"float32": (1e-4,)}}, {"eval_max_steps": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            GateConfig(**bad)
    with pytest.raises(TypeError):
        GateConfig(None)  # keyword-only


def test_sim_evaluator_refuses_bad_arguments_and_unhonoured_pins():
    for bad, match in (({"address": "nowhere"}, "HOST:PORT"), ({"env": ""}, "env"), ({"envs": 0}, "envs"),
                       ({"max_steps": 0}, "max_steps")):
        kw = {"address": "127.0.0.1:1", "env": "InvertedPendulum-v5", "pin": print, "unpin": print, **bad}
        with pytest.raises(ValueError, match=match):
            SimEvaluator(**kw)
    summary = {"returns": [5.0, 6.0], "cut_episodes": 0, "policy_versions": {"1": 10, "2": 3}, "errors": {}}
    with pytest.raises(EvaluationError, match="did not honour the pin"):
        _episode_returns(summary, version=2, episodes=2)
    with pytest.raises(EvaluationError, match="1 episodes completed, 2 asked for"):
        _episode_returns({**summary, "returns": [5.0], "policy_versions": {"2": 3}}, version=2, episodes=2)
    assert _episode_returns({**summary, "policy_versions": {"2": 3}}, version=2, episodes=2) == [5.0, 6.0]


def test_a_gate_without_triton_fails_closed_and_skips_what_cannot_run(tmp_path):
    async def scenario():
        client = PolicyClient("127.0.0.1:1", timeout_s=1.0)
        gate = Gate(client=client, experience_dir=tmp_path / "none", evaluator=None, config=GateConfig())
        probe = np.zeros((2, 4), np.float32)
        header = policies_pb2.PublishHeader(policy="p", probe_inputs=[encode("observation", probe)],
                                            probe_outputs=[encode("action", probe[:, :1])])
        try:
            return await gate.check_served(policy="p", version=2, incumbent=1, header=header, action_spec=ACT), \
                await gate.consistency("p", 2, policies_pb2.PublishHeader(policy="p"))
        finally:
            await client.close()

    (consistency, sanity, evaluation_), no_probe = asyncio.run(scenario())
    assert not consistency.passed and "could not complete" in consistency.detail and "UNAVAILABLE" in consistency.detail
    assert evaluation_.is_skipped and "no eval env" in evaluation_.detail
    assert sanity.is_skipped and "no experience log" in sanity.detail
    assert not no_probe.passed and "no probe_inputs" in no_probe.detail


def test_recent_observations_reads_the_newest_steps_of_the_policy_backwards_over_segments(tmp_path):
    from bridge.experience import ExperienceLog
    from bridge.gate.samples import recent_observations
    from tests.experience.helpers import transition

    async def fill():
        log = ExperienceLog(tmp_path, segment_bytes=12000, fsync=False)
        await log.start()
        try:
            for step in range(60):  # interleaved: two sessions of "pi", one of another policy, the gate's own
                for session, policy in (("a", "pi"), ("b", "pi"), ("c", "other"), ("gate-pi-v2-x-0", "pi")):
                    await log.append(transition(session, step, episode=step // 25, obs_dim=4, policy=policy))
        finally:
            await log.close()

    asyncio.run(fill())
    inputs = (Spec("observation", np.float32, (4,)),)
    assert 5 < len(list(tmp_path.glob("segment-*.mcap"))) < 64
    batch = recent_observations(tmp_path, policy="pi", inputs=inputs, count=30)
    assert len(batch) == 30 and batch.inputs["observation"].shape == (30, 4)
    assert {s for s, _, _ in batch.keys} == {"a", "b"}                          # not "other", not the gate's
    assert sorted(step for s, _, step in batch.keys if s == "a") == list(range(45, 60))   # the newest, in order
    expected = transition("a", 59, obs_dim=4)
    np.testing.assert_array_equal(batch.inputs["observation"][batch.keys.index(("a", 2, 59))],
                                  np.frombuffer(expected.observation[0].data, np.float32))
    # pairs: consecutive steps of one episode of one session (episode 1 ends at step 49)
    steps = {i: key for i, key in enumerate(batch.keys)}
    assert all(steps[j][0] == steps[i][0] and steps[j][1] == steps[i][1] and steps[j][2] == steps[i][2] + 1
               for i, j in batch.pairs)
    assert len(batch.pairs) == 2 * (15 - 1 - 1)   # 14 consecutive pairs per session, less the episode change
    assert len(recent_observations(tmp_path, policy="pi", inputs=inputs, count=1000)) == 120
    assert len(recent_observations(tmp_path, policy="none", inputs=inputs, count=10)) == 0
    wrong_shape = (Spec("observation", np.float32, (5,)),)
    assert len(recent_observations(tmp_path, policy="pi", inputs=wrong_shape, count=10)) == 0


def test_an_empty_artifact_fails_and_configs_build_evaluators():
    assert "no tensors" in integrity({}, None).detail and not integrity({}, None).passed
    config = GateConfig(eval_env="InvertedPendulum-v5", eval_max_steps=40)
    assert hash(config) == hash(GateConfig(eval_env="InvertedPendulum-v5", eval_max_steps=40))
    evaluator = SimEvaluator.from_config(config, address="127.0.0.1:5", pin=print, unpin=print, seed=3,
                                         sim_args=["--tls-ca", "ca.crt"])
    cmd = evaluator.command("pend", 4, 2, "gate-pend-v4-x", Path("/tmp/s.json"))
    assert cmd[1:4] == ["-m", "tether", "sim"] and cmd[-2:] == ["--tls-ca", "ca.crt"]
    flags = dict(zip(cmd[4:-2:2], cmd[5:-2:2], strict=True))
    assert flags == {"--gateway": "127.0.0.1:5", "--env": "InvertedPendulum-v5", "--envs": "2", "--episodes": "2",
                     "--seed": "3", "--policy": "pend", "--session-id": "gate-pend-v4-x", "--summary": "/tmp/s.json",
                     "--status-every": "3600", "--max-episode-steps": "40"}
    with pytest.raises(ValueError, match="eval_env is None"):
        SimEvaluator.from_config(GateConfig(), address="127.0.0.1:5", pin=print, unpin=print)


def test_evaluation_envs_per_policy():
    config = GateConfig(eval_env="Hopper-v5", eval_envs={"pend": "InvertedPendulum-v5"})
    assert config.env_for("pend") == "InvertedPendulum-v5" and config.env_for("hopper") == "Hopper-v5"
    assert GateConfig(eval_envs={"pend": "InvertedPendulum-v5"}).env_for("other") is None
    with pytest.raises(ValueError, match="eval_envs maps policy names"):
        GateConfig(eval_envs={"pend": ""})
    evaluator = SimEvaluator.from_config(GateConfig(eval_envs={"pend": "InvertedPendulum-v5"}),
                                         address="127.0.0.1:5", pin=print, unpin=print)
    cmd = evaluator.command("pend", 2, 1, "p", Path("s.json"))
    assert cmd[cmd.index("--env") + 1] == "InvertedPendulum-v5"
    with pytest.raises(EvaluationError, match="no env to evaluate policy 'other'"):
        evaluator.command("other", 2, 1, "p", Path("s.json"))

    async def skipped():
        gate = Gate(client=None, experience_dir=None, evaluator=evaluator, config=GateConfig(eval_envs={"a": "b"}))
        return await gate.evaluation("other", 2, 1)

    assert "no eval env configured for policy 'other'" in asyncio.run(skipped()).detail


def test_a_stochastic_policy_is_judged_on_its_means_and_its_samples_must_be_finite():
    means = np.array([[0.5, 0.0], [0.9, 1.0]], np.float32)
    samples = np.array([[1.7, -2.5], [0.2, 3.9]], np.float32)   # beyond the bounds: the actuator clips them
    ok = action_sanity({"action": means}, ACT, sampled={"action": samples})
    assert ok.passed and "judged on the means ['action_mean']" in ok.detail
    nan = action_sanity({"action": means}, ACT, sampled={"action": np.array([[np.nan, 0], [0, 0]], np.float32)})
    assert not nan.passed and "1 of 2 sampled 'action' actions are not finite" in nan.detail
    assert nan.figures["non_finite"] == 0.5


def test_a_log_index_follows_the_segment_being_written(tmp_path):
    from bridge.experience import ExperienceLog
    from bridge.gate.samples import LogIndex, recent_observations
    from tests.experience.helpers import transition

    inputs, index = (Spec("observation", np.float32, (4,)),), LogIndex()

    async def scenario():
        log = ExperienceLog(tmp_path, fsync=False)
        await log.start()
        newest = []
        try:
            for first, last in ((0, 30), (30, 45)):
                for step in range(first, last):
                    await log.append(transition("a", step, obs_dim=4, policy="pi"))
                batch = recent_observations(tmp_path, policy="pi", inputs=inputs, count=10, index=index)
                newest.append([step for _, _, step in batch.keys])
        finally:
            await log.close()
        return newest

    assert asyncio.run(scenario()) == [list(range(20, 30)), list(range(35, 45))]
    # the log closed its segment (closing records after the messages): still read the same way
    assert [k[2] for k in recent_observations(tmp_path, policy="pi", inputs=inputs, count=3, index=index).keys] \
        == [42, 43, 44]
