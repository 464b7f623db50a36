"""PPO's learning dynamics without the processes: the SAME learner (`trainer.ppo.PPOLearner`) and
trajectory code on 8 in-process MuJoCo envs, with the loop's timing emulated on a simulated clock
(env steps/s of the 8 sims, update seconds per optimiser step, publish->served latency, one
publish in flight, trainer start-up), so the data comes from versions behind the learner exactly
as it does through gateway + Triton. One run takes ~20-60 s of CPU instead of 5 minutes.

    python benchmarks/learning_offline.py --seeds 0 1 2 3 4 [--batch 2048 --lr 3e-4 ...]

Prints one row per seed (simulated seconds and env steps to a mean return >= 500 over the last
20 episodes, as the end-to-end test measures it) and writes JSON with --json.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch

from protos import codec, experience_pb2
from sim.mujoco import make_env
from trainer.policy import GaussianPolicy
from trainer.ppo import PPOConfig, PPOLearner
from trainer.trajectory import TrajectoryAssembler


def transition(i: int, ts, nts, obs: np.ndarray, action: np.ndarray, log_prob: float, *, episode: int, step: int,
               version: int, t_ns: int) -> experience_pb2.Transition:
    t = experience_pb2.Transition(
        session=f"sim-{i}", episode=episode, step=step, step_type=int(ts.step_type),
        observation=[codec.encode("observation", obs)], action=[codec.encode("action", action)],
        reward=nts.reward, terminated=nts.terminated, truncated=nts.last() and not nts.terminated,
        policy_version=version, has_log_prob=True, log_prob=log_prob)
    t.timing.gateway_recv_ns = t_ns
    if nts.last():
        t.next_observation.extend([codec.encode("observation", nts.observation["observation"])])
    return t


def run(a: argparse.Namespace, seed: int, config: PPOConfig) -> dict:
    """One emulated loop run; returns seconds/steps to the target and the return curve."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    envs = [make_env(a.env, seed=seed * 100 + i) for i in range(a.envs)]
    policy = GaussianPolicy(envs[0].observation_spec()[0], envs[0].action_spec()[0], seed=seed,
                            log_std_init=a.log_std_init)
    acting, version = copy.deepcopy(policy), 1  # what Triton serves
    learner = PPOLearner(policy, config=config, seed=seed)
    asm = TrajectoryAssembler()
    ts = [env.reset() for env in envs]
    episode, step = [0] * a.envs, [0] * a.envs
    returns: deque[float] = deque(maxlen=20)
    running = [0.0] * a.envs
    dt = a.envs / a.rate
    clock, env_steps, updates = 0.0, 0, 0
    busy_until = a.startup                # the trainer is starting
    in_flight: tuple[float, GaussianPolicy, int] | None = None   # (live at, weights, update) being published
    pending_publish = False               # an update finished: publish at busy_until if the publisher is free
    served_update = 0                     # the learner's update whose weights the sims act with
    newest, newest_ns = 1, 0
    reached = None
    curve, next_tick = [], 1.0
    cpu0 = time.process_time()
    try:
        while clock < a.seconds:
            # sims: one step of every env with the served version
            obs = np.stack([t.observation["observation"] for t in ts])
            with torch.no_grad():
                action, log_prob, _ = acting(torch.from_numpy(obs))
            for i, env in enumerate(envs):
                nts = env.step({"action": action[i].numpy()})
                asm.add(transition(i, ts[i], nts, obs[i], action[i].numpy(), float(log_prob[i, 0]),
                                   episode=episode[i], step=step[i], version=version, t_ns=int(clock * 1e9)))
                running[i] += nts.reward
                step[i] += 1
                if nts.last():
                    returns.append(running[i])
                    running[i] = 0.0
                    nts, episode[i], step[i] = envs[i].reset(), episode[i] + 1, 0
                ts[i] = nts
            env_steps += a.envs
            clock += dt
            if clock >= next_tick:
                next_tick += 1.0
                r = float(np.mean(returns)) if returns else None
                curve.append((round(clock, 1), env_steps, r, version))
                if reached is None and r is not None and r >= a.target:
                    reached = (clock, env_steps)
                    if not a.continue_after:
                        break
            if in_flight is not None and clock >= in_flight[0]:
                acting, version, served_update = in_flight[1], version + 1, in_flight[2]  # switch at the next step
                newest, newest_ns = version, int(clock * 1e9)
                in_flight = None
            if clock < busy_until:
                continue
            if pending_publish and in_flight is None:   # the loop submits right after an update
                in_flight = (clock + a.publish_s * rng.uniform(0.85, 1.2), copy.deepcopy(learner.policy), updates)
                pending_publish = False
            if not a.publish_when_free:
                pending_publish = False
            if asm.ready < a.batch or (a.max_ahead > 0 and updates - served_update >= a.max_ahead):
                continue
            steps0 = learner.steps
            segments = asm.take()
            n = sum(len(s) for s in segments)
            stats = learner.update(segments, newest_version=newest, newest_publish_ns=newest_ns)
            asm.take_episode_returns()
            if a.verbose:
                r = float(np.mean(returns)) if returns else float("nan")
                print(f"  t {clock:6.1f} upd {updates} n {n} v{version} ahead {updates - served_update} ret {r:.0f} "
                      + " ".join(f"{k} {stats[k]:.3g}" for k in a.verbose.split(",")), flush=True)
            updates += 1
            k = learner.steps - steps0
            busy_until = clock + a.update_overhead_s + k * (a.step_s + a.sample_s * n / config.minibatches)
            pending_publish = True
    finally:
        for env in envs:
            env.close()
    return {"seed": seed, "seconds_to_target": None if reached is None else round(reached[0], 1),
            "steps_to_target": None if reached is None else reached[1], "updates": updates,
            "versions": version, "final_return": curve[-1][2] if curve else None,
            "cpu_s": round(time.process_time() - cpu0, 1), "curve": curve[::5]}


def _flag(text: str) -> bool:
    if text.lower() not in ("0", "1", "true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r} must be 0/1/true/false")
    return text.lower() in ("1", "true")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="InvertedPendulum-v5")
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--seconds", type=float, default=300.0, help="simulated seconds per run")
    p.add_argument("--target", type=float, default=500.0)
    p.add_argument("--continue-after", action="store_true", help="run on after reaching the target")
    # the loop's timing (measured on the shared 2-core machine, see trainer.log / gateway.log)
    p.add_argument("--rate", type=float, default=330.0, help="env steps/s of all sims together")
    p.add_argument("--startup", type=float, default=20.0, help="seconds before the trainer's first update")
    p.add_argument("--publish-s", type=float, default=8.0, help="publish -> served latency")
    p.add_argument("--update-overhead-s", type=float, default=0.1)
    p.add_argument("--step-s", type=float, default=0.010, help="seconds per optimiser step (2 DDP ranks)")
    p.add_argument("--sample-s", type=float, default=0.00006, help="seconds per sample per optimiser step")
    # learning settings
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--max-ahead", type=int, default=0, help="updates the learner may be ahead of the served "
                   "version (0: unbounded)")
    p.add_argument("--publish-when-free", action="store_true", help="publish the newest weights as soon as the "
                   "publisher is free (else only right after an update, as the loop does)")
    p.add_argument("--log-std-init", type=float, default=0.0)
    for name, default in PPOConfig.__dataclass_fields__.items():
        if name in ("critic_hidden",):
            continue
        kind = _flag if type(default.default) is bool else type(default.default)
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--verbose", default="", help="comma-separated update stats to print per update")
    a = p.parse_args(argv)
    overrides = {name: getattr(a, name) for name in PPOConfig.__dataclass_fields__
                 if getattr(a, name, None) is not None}
    defaults = {"entropy_coef": 0.005, "target_kl": 0.05}  # `tether train`'s defaults
    config = PPOConfig(**{**defaults, **overrides})
    torch.set_num_threads(1)
    rows = []
    for seed in a.seeds:
        row = run(a, seed, config)
        rows.append(row)
        print(f"seed {seed}: {row['seconds_to_target']} s, {row['steps_to_target']} steps to {a.target:g}; "
              f"updates {row['updates']} versions {row['versions']} final {row['final_return']} "
              f"(cpu {row['cpu_s']} s)", flush=True)
    times = [r["seconds_to_target"] for r in rows]
    ok = [t for t in times if t is not None]
    print(f"reached {len(ok)}/{len(rows)}; seconds {times}; median {np.median(ok) if ok else None}")
    if a.json:
        a.json.write_text(json.dumps({"args": {k: (str(v) if isinstance(v, Path) else v)
                                               for k, v in vars(a).items()}, "config": str(config),
                                      "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
