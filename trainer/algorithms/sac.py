"""SAC's part of the loop (trainer.loop), on one rank: a replay seeded from logs, filled from the stream, and SAC
updates (trainer.sac.SACLearner) at a replay ratio.

    tether train --algo sac --gateway 127.0.0.1:50051 --policy invertedpendulum_v5 --nproc 1 \\
        --seed-log runs/old/experience --demos runs/teleop/experience --utd 1 --publish-every 250 --seconds 300

The replay (trainer.replay) is a cache of the log: the online half fills from the stream (the gateway
replays its log from `--from-offset`, then goes live; or the NATS stream with --experience), the offline half
from `--seed-log` / `--demos` MCAP segments (or LeRobotDataset v3.0 folders) read at start and from every
intervention the stream carries.
Each new row makes --utd updates due; they run CHUNK at a time between polls. After a restart the learner
resumes from its checkpoint (networks, optimisers, temperature, counters) and subscribes again from
`buffer-size` transitions before the offset it had consumed, so the buffer refills from the log (those refill
rows do not count towards the replay ratio). From the NATS stream it resumes where its durable consumer was
acknowledged (at the last checkpoint): the replay starts again from the seed logs and what comes next.
"""

from __future__ import annotations

import argparse
import collections

import numpy as np

from bridge.client import ServedPolicy
from trainer import dist
from trainer.loop import Algorithm, Schedule, Source, finite, served_module
from trainer.publisher import Publication, Versions
from trainer.replay import MixedReplay, ReplayAdder
from trainer.sac import SACConfig, SACLearner
from trainer.sources import LogDataset, misfit

__all__ = ["SAC", "seed_replay"]

PROBE = 16
CHUNK = 16  # updates between polls of the stream


def seed_replay(adder: ReplayAdder, directories: list[str], *, policy: str | None, expect) -> int:
    """Every usable transition of the MCAP segments (or LeRobotDataset v3.0 folders) under `directories` into `adder`;
    returns how many."""
    expected = {s.name: s for s in expect}
    count = 0
    for directory in directories:
        for t in LogDataset(directory, policy=policy).transitions:
            if misfit(t, expected) is None:
                adder.add(t)
                count += 1
    return count


class SAC(Algorithm):
    name = "sac"

    def __init__(self, args: argparse.Namespace, served: ServedPolicy | None, versions: Versions):
        if served is None:
            raise ValueError("--algo sac needs --gateway")
        if dist.world()[1] > 1:
            raise ValueError(f"--algo sac runs on one rank (give --nproc 1), this group has {dist.world()[1]}")
        self.args, self.versions = args, versions
        obs_name, act_name = served.inputs[0].name, served.outputs[0].name
        expect = (*served.inputs, *served.outputs)
        config = SACConfig(gamma=args.gamma, tau=args.tau, actor_lr=args.lr, critic_lr=args.lr, alpha_lr=args.lr,
                           init_alpha=args.init_alpha, critic_hidden=args.critic_hidden)
        self.learner = SACLearner(served_module("gaussian", served, seed=args.seed), config=config, seed=args.seed)
        self.replay = MixedReplay(capacity=args.buffer_size, observation_size=self.learner.obs_size,
                                  action_size=self.learner.act_size)
        self.demos = ReplayAdder(self.replay, observation=obs_name, action=act_name, demos=True)
        self.seeded = seed_replay(ReplayAdder(self.replay, observation=obs_name, action=act_name, offline=True),
                                  args.seed_log, policy=args.data_policy, expect=expect)
        self.seeded += seed_replay(self.demos, args.demos, policy=args.data_policy, expect=expect)
        self.buffer_at_start = len(self.replay)
        self.live = ReplayAdder(self.replay, observation=obs_name, action=act_name)
        self.rng = np.random.default_rng(args.seed)
        self.batch = args.batch or 256
        self.every = args.checkpoint_every or 1000
        self.schedule = Schedule(checkpoint_every=self.every, publish_every=args.publish_every)
        self.window = max(4 * self.batch, 8192)
        self.resume_offset = self.consumed = self.refill_until = args.from_offset
        self.returns: collections.deque[float] = collections.deque(maxlen=20)
        self.mean_return, self.best_return = float("nan"), float("-inf")
        self.due, self.fresh_rows, self.reward_version = 0.0, 0, ""
        self.stats: dict[str, float] = {}

    @property
    def backlog(self) -> float:
        return self.due

    def restore(self, meta: dict) -> None:
        self.rng.bit_generator.state = meta["np_rng"]
        self.consumed = self.refill_until = meta["offset"]  # transitions before it were learned from: refill only
        self.resume_offset = max(self.args.from_offset, self.consumed - self.args.buffer_size)

    def state(self) -> dict:
        return {"offset": self.consumed, "np_rng": self.rng.bit_generator.state}

    def start_line(self) -> str:
        v, a = self.versions, self.args
        return (f"sac: {v.policy} v{v.version} (parent v{v.parent}) from offset {self.resume_offset}, batch "
                f"{self.batch}, utd {a.utd:g}, publish every {a.publish_every} updates, seeded {self.seeded} "
                f"transitions -> {self.buffer_at_start} rows ({len(self.replay.offline)} offline, {self.demos.rows} "
                f"demonstration rows), step {self.learner.steps}")

    def collect(self, source: Source) -> None:
        got = source.poll(timeout=0.0 if self.due >= 1 else 0.05, max_items=8192)
        rows_before = self.live.rows
        for t in got:
            self.live.add(t)
            self.reward_version = t.reward_version or self.reward_version
            if t.offset >= self.refill_until:
                self.fresh_rows += 1
        if got:
            self.consumed = max(self.consumed, got[-1].offset + 1)
            source.ack(self.consumed)
            if got[-1].offset >= self.refill_until:
                cap = float(max(self.args.publish_every, 4 * CHUNK))
                self.due = min(self.due + self.args.utd * (self.live.rows - rows_before), cap)
        self.returns.extend(self.live.take_episode_returns())
        if self.returns:
            self.mean_return = float(np.mean(self.returns))
            self.best_return = max(self.best_return, self.mean_return)

    def ready(self, backlog: float) -> bool:
        return len(self.replay) >= max(self.args.learning_starts, 1) and backlog >= 1

    def update(self) -> None:
        for _ in range(min(int(self.due), CHUNK)):
            self.stats = self.learner.update(self.replay.sample(self.batch, self.rng))
            self.due -= 1
            steps = self.learner.steps
            if (self.args.steps and steps >= self.args.steps) or steps % self.every == 0:
                break  # a checkpoint's step is a multiple of --checkpoint-every

    def publication(self) -> Publication:
        return Publication(progress=self.learner.steps, trainer_step=self.learner.steps, data_offset=self.consumed,
                           reward_version=self.reward_version,
                           probe=self.replay.sample(PROBE, self.rng)["observation"])

    def report(self, elapsed: float) -> tuple[str, dict]:
        line = (f"sac step {self.learner.steps} rows {self.fresh_rows} buffer {len(self.replay.online)}+"
                f"{len(self.replay.offline)} return {self.mean_return:.1f} (n {len(self.returns)}) "
                f"v{self.versions.version} utd {self.learner.steps / max(self.fresh_rows, 1):.2f} interventions "
                f"{self.live.interventions}")
        s = self.stats
        if s:
            line += (f" | q {s['q']:.2f} critic {s['critic_loss']:.3f} alpha {s['alpha']:.3f} "
                     f"std {np.exp(s['log_std']):.2f}")
        return line, {"rows": self.fresh_rows, "return": finite(self.mean_return), **s}

    def summary(self, elapsed: float) -> dict:
        return {"rows": self.fresh_rows, "seeded": self.seeded, "buffer_at_start": self.buffer_at_start,
                "offline_rows": len(self.replay.offline), "online_rows": len(self.replay.online),
                "demo_rows": self.demos.rows, "interventions": self.live.interventions,
                "mean_return": finite(self.mean_return), "best_return": finite(self.best_return)}
