"""Real 2-process torchrun runs (gloo on loopback) through `tether train`'s launcher.

- BC on an MCAP log: both ranks end with identical parameters; a rank killed mid-run is
  restarted by torchrun, resumes from the last checkpoint and ends bit-identical to the
  uninterrupted run.
- PPO against the stand-in gateway (real MuJoCo actors): versions are published from rank 0
  with lineage and probe outputs the registry verifies; every rank learns the new version.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from bridge.common.processes import spawn, stop_group
from protos import codec, experience_pb2
from tests.support.processes import descendants, running
from tests.support.waiting import wait_until
from tests.trainer.standin import StandIn, env_specs
from trainer.main import main as train_main
from trainer.sources import write_transitions

ROOT = Path(__file__).resolve().parents[2]


def scripted_log(directory: Path, n: int = 1200) -> None:
    """A scripted controller's transitions: action = clip(-K obs), with the clip in applied_action."""
    rng = np.random.default_rng(0)
    gain = np.array([[0.8, -0.3, 0.5, 0.1]], np.float32)
    rows = []
    for i in range(n):
        obs = rng.normal(size=4).astype(np.float32)
        action = (-gain @ obs).astype(np.float32)
        rows.append(experience_pb2.Transition(
            offset=i, session=f"robot-{i % 3}", episode=0, step=i // 3, policy="scripted",
            observation=[codec.encode("observation", obs)], action=[codec.encode("action", action)],
            applied_action=[codec.encode("action", np.clip(action, -1, 1))]))
    directory.mkdir(parents=True)
    write_transitions(directory / "seg-000.mcap", rows[:700])
    write_transitions(directory / "seg-001.mcap", rows[700:])


def tether_train(*args: str, timeout: float = 240) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-m", "trainer.main", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
def test_bc_ranks_stay_identical_and_a_killed_rank_resumes_bit_exact(tmp_path):
    scripted_log(tmp_path / "log")
    common = ["--nproc", "2", "--algo", "bc", "--arch", "mlp", "--log-dir", str(tmp_path / "log"), "--steps", "12",
              "--batch", "32", "--checkpoint-every", "4", "--seed", "0", "--status-every", "0"]
    plain, _ = tether_train(*common, "--max-restarts", "0", "--checkpoint-dir", str(tmp_path / "a"),
                            "--out", str(tmp_path / "a.safetensors"))
    assert plain["exit_code"] == 0 and plain["steps"] == 12 and plain["world_size"] == 2
    assert plain["param_sha256"][0] == plain["param_sha256"][1]

    killed, stderr = tether_train(*common, "--max-restarts", "2", "--checkpoint-dir", str(tmp_path / "b"),
                                  "--out", str(tmp_path / "b.safetensors"), "--fail-at-step", "6")
    assert "failing on purpose at step 6" in stderr
    assert "resuming from" in stderr and "step-00000004" in stderr  # the last checkpoint before the kill
    assert killed["restarts"] == 1 and killed["steps"] == 12
    assert killed["param_sha256"] == plain["param_sha256"]  # bit-exact: the same next updates
    a, b = load_file(tmp_path / "a.safetensors"), load_file(tmp_path / "b.safetensors")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert sorted(p.name for p in (tmp_path / "b").glob("step-*")) == ["step-00000008", "step-00000012"]


@pytest.mark.slow
def test_ppo_publishes_from_rank_zero_and_resumes_after_a_killed_rank(tmp_path):
    """Iterations of 16 optimiser steps; rank 1 dies after the second update (step 32), before
    that iteration's checkpoint: the group resumes from step 16, redoes iteration 2 and goes on,
    the lineage unbroken (a version published from the checkpoint's weights is recognised)."""
    obs, act = env_specs("InvertedPendulum-v5")
    with StandIn(obs, act, policy="pendulum") as gw:
        gw.start_actors("InvertedPendulum-v5", 3)
        summary, stderr = tether_train(
            "--nproc", "2", "--max-restarts", "1", "--gateway", gw.address, "--algo", "ppo", "--policy", "pendulum",
            "--steps", "48", "--batch", "256", "--epochs", "4", "--minibatches", "4", "--target-kl", "0",
            "--fail-at-step", "32",
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics", str(tmp_path / "metrics.jsonl"))
        publishes = list(gw.publishes)
        resumed = gw.subscriptions[2:]
    assert summary["restarts"] == 1 and "resuming from" in stderr and "step-00000016" in stderr
    assert summary["steps"] == 48 and summary["iterations"] == 3
    assert summary["param_sha256"][0] == summary["param_sha256"][1]
    # publishes run in the background (one in flight): an iteration may find the last one unfinished
    n = len(publishes)
    assert n >= 2 and summary["published_versions"] == list(range(2, 2 + n)) and summary["final_version"] == 1 + n
    assert [h.lineage.parent_version for h in publishes] == list(range(1, 1 + n))  # an unbroken chain
    steps = [h.lineage.trainer_step for h in publishes]
    assert steps == sorted(set(steps)) and all(s % 16 == 0 for s in steps) and steps[-1] <= 48
    assert all(h.lineage.data_offset > 0 and h.lineage.trainer.startswith("ppo@") for h in publishes)
    assert all(h.format == "safetensors" and len(h.probe_inputs) == 1 for h in publishes)
    # resumed from the checkpoint's offsets, not from the start (a rank that had consumed nothing of its
    # shard by step 16, which a loaded machine can make happen, legitimately resumes from 0)
    assert sorted(s.shard for s in resumed) == [0, 1] and any(s.from_offset > 0 for s in resumed)
    assert "lag_versions_mean" in summary and "ppo it 3 step 48" in stderr
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["steps"] for r in rows] == [16, 32, 48]  # the killed iteration 2 died before its row
    assert {"lag_versions_mean", "lag_seconds_max", "policy_loss", "version", "elapsed_s"} <= set(rows[-1])
    latest = (tmp_path / "ckpt" / "latest").read_text()
    meta = json.loads((tmp_path / "ckpt" / latest / "meta.json").read_text())
    assert meta["step"] == 48 and len(meta["offsets"]) == 2
    assert meta["published"] == summary["published_versions"][:len(meta["published"])]
    assert meta["version"] == (meta["published"] or [1])[-1]


@pytest.mark.slow
def test_ppo_with_max_ahead_trains_only_on_top_of_the_served_version(tmp_path):
    """--max-ahead 1 against a slow gateway (each Publish takes 1 s): every update is published,
    and the next one waits until it is served, so each update starts from the version the
    sessions act with."""
    obs, act = env_specs("InvertedPendulum-v5")
    with StandIn(obs, act, policy="pendulum") as gw:
        gw.publish_delay_s = 1.0
        gw.start_actors("InvertedPendulum-v5", 3)
        summary, _ = tether_train(
            "--nproc", "2", "--gateway", gw.address, "--algo", "ppo", "--policy", "pendulum", "--steps", "48",
            "--batch", "256", "--epochs", "4", "--minibatches", "4", "--target-kl", "0", "--max-ahead", "1",
            "--obs-norm", "--value-norm", "--metrics", str(tmp_path / "metrics.jsonl"))
        publishes = list(gw.publishes)
    assert [h.lineage.trainer_step for h in publishes] == [16, 32, 48]
    assert summary["published_versions"] == [2, 3, 4] and summary["param_sha256"][0] == summary["param_sha256"][1]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == [1, 2, 3]  # update k started from the served version k


@pytest.mark.parametrize(("args", "message"), [
    (["--algo", "ppo", "--gateway", "x:1", "--steps", "1", "--max-ahead", "1", "--publish-every", "2"],
     "needs --publish-every 1"),
    (["--algo", "bc", "--steps", "1"], "--log-dir"),
    (["--algo", "ppo", "--steps", "1"], "--gateway"),
    (["--algo", "bc", "--log-dir", ".", "--nproc", "0", "--steps", "1"], "--nproc must be >= 1"),
    (["--algo", "bc", "--log-dir", "."], "--steps, --seconds, --target-return or --stop-file"),
    (["--algo", "bc", "--log-dir", ".", "--steps", "1", "--nnodes", "1:2"], "needs --rdzv-endpoint"),
    (["--algo", "bc", "--log-dir", ".", "--steps", "1", "--nnodes", "2:1", "--rdzv-endpoint", "h:1"],
     "1 <= MIN <= MAX"),
    (["--algo", "bc", "--log-dir", ".", "--steps", "1", "--nnodes", "2", "--rdzv-endpoint", "h"], "HOST:PORT"),
])
def test_the_launcher_rejects_bad_options_before_starting(args, message):
    with pytest.raises(SystemExit, match=message):
        train_main(args)


@pytest.mark.slow
def test_bc_from_the_served_weights_publishes_a_version_that_fits_the_controller(tmp_path):
    """One rank, --arch gaussian: starts from the served v1, fits action_mean to the scripted
    controller's applied actions, publishes v2 (probe checked by the stand-in's registry)."""
    from protos.codec import Spec
    from trainer.policy import GaussianPolicy

    scripted_log(tmp_path / "log", n=600)
    obs, act = Spec("observation", np.float32, (4,)), Spec("action", np.float32, (1,), low=(-3.0,), high=(3.0,))
    with StandIn(obs, act, policy="p") as gw:
        summary, stderr = tether_train(
            "--nproc", "1", "--max-restarts", "0", "--gateway", gw.address, "--algo", "bc", "--policy", "p",
            "--arch", "gaussian", "--log-dir", str(tmp_path / "log"), "--steps", "300", "--batch", "64",
            "--lr", "3e-3", "--out", str(tmp_path / "bc.safetensors"))
        (header,) = gw.publishes
        served = gw.modules[2]
    assert summary["published_version"] == 2 and summary["parent_version"] == 1
    assert header.lineage.parent_version == 1 and header.lineage.trainer_step == 300
    assert header.lineage.data_offset == 600 and header.lineage.trainer.startswith("bc@")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    want = np.clip(-(x @ np.array([0.8, -0.3, 0.5, 0.1], np.float32)), -1, 1)
    import torch

    with torch.no_grad():
        got = served.mean(torch.from_numpy(x)).numpy()[:, 0]
    assert isinstance(served, GaussianPolicy) and float(np.abs(got - want).mean()) < 0.1, stderr[-2000:]


@pytest.mark.slow
def test_a_sigtermed_launcher_stops_torchrun_and_its_ranks_before_it_exits(tmp_path):
    """`kill -TERM` to `tether train` alone (what systemd, Kubernetes and `timeout` send): its torchrun agent and
    both ranks are gone when it exits, with 143 (the shell's status for SIGTERM)."""
    scripted_log(tmp_path / "log")
    proc = spawn([sys.executable, "-m", "trainer.main", "--nproc", "2", "--algo", "bc", "--arch", "mlp", "--log-dir",
                  str(tmp_path / "log"), "--steps", "100000", "--batch", "32", "--step-sleep", "0.05",
                  "--checkpoint-dir", str(tmp_path / "ckpt"), "--status-every", "0"], cwd=ROOT,
                 stdout=(log := open(tmp_path / "train.log", "w")), stderr=subprocess.STDOUT)  # noqa: SIM115
    try:
        def ranks() -> dict[int, str]:
            return {pid: cmd for pid, cmd in descendants(proc.pid).items()
                    if "trainer.worker" in cmd and "torch.distributed.run" not in cmd}  # not torchrun's own line

        wait_until(lambda: len(ranks()) == 2 or proc.poll() is not None, what="two ranks running", timeout=120)
        assert proc.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
        under = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert not running(under), f"processes outlived tether train: {running(under)}"
    finally:
        stop_group(proc, grace_s=5)
        log.close()
