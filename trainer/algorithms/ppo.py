"""PPO's part of the loop (trainer.loop): this rank's shard of the stream -> trajectory segments -> one PPO update
(trainer.ppo.PPOLearner, DDP over the ranks) once the ranks together hold --batch transitions.

Every rank learns each new version (the loop's all-reduce), which stale data is measured against: with
`--stale drop` a transition acted more than --max-version-lag versions back is never assembled. With
--max-ahead the learner waits (reading on) until the sessions act with its last update's version.
--publish-every and --checkpoint-every count updates; a checkpoint keeps every rank's stream offset.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bridge.client import ServedPolicy
from trainer import dist
from trainer.loop import Algorithm, Schedule, Source, finite, observations, served_module
from trainer.ppo import PPOConfig, PPOLearner
from trainer.publisher import Publication, Versions
from trainer.trajectory import TrajectoryAssembler

__all__ = ["PPO"]

PROBE = 16


class PPO(Algorithm):
    name = "ppo"

    def __init__(self, args: argparse.Namespace, served: ServedPolicy | None, versions: Versions):
        if served is None:
            raise ValueError("--algo ppo needs --gateway")
        self.args, self.versions = args, versions
        self.obs_name, self.obs_width = served.inputs[0].name, served.inputs[0].shape[0]
        self.config = PPOConfig(gamma=args.gamma, lam=args.lam, clip=args.clip, epochs=args.epochs,
                                minibatches=args.minibatches, lr=args.lr, entropy_coef=args.entropy_coef,
                                stale=args.stale, target_kl=args.target_kl, max_version_lag=args.max_version_lag,
                                rho_max=args.rho_max, bf16=args.bf16, normalize_obs=args.obs_norm,
                                normalize_value=args.value_norm)
        self.learner = PPOLearner(served_module(args.arch, served, seed=args.seed), config=self.config,
                                  observation=self.obs_name, action=served.outputs[0].name, seed=args.seed)
        self.generator = self.learner.generator
        self.batch = args.batch or 1024
        self.schedule = Schedule(checkpoint_every=args.checkpoint_every or 1, publish_every=args.publish_every,
                                 report_each_update=True)
        self.window = max(4 * self.batch, 4096)
        self.resume_offset = self.consumed = args.from_offset
        self.iteration = self.samples = self.dropped = 0
        self.assembler = TrajectoryAssembler()
        self.mean_return, self.best_return = float("nan"), float("-inf")
        self.probe: np.ndarray | None = None
        self.reward_version = ""
        self.stats: dict[str, float] = {}
        self.sums = [0.0, 0.0, 0.0]      # the last update's episodes, their return sum, stale dropped: all ranks
        self.update_s = 0.0

    @property
    def progress(self) -> int:
        return self.iteration

    @property
    def backlog(self) -> float:
        return float(self.assembler.ready)

    def restore(self, meta: dict) -> None:
        rank, world = dist.world()
        self.iteration, self.samples = meta["iteration"], meta["samples"]
        offsets = meta["offsets"]
        self.resume_offset = self.consumed = offsets[rank] if len(offsets) == world else min(offsets)

    def state(self) -> dict:
        return {"iteration": self.iteration, "samples": self.samples, "offsets": dist.per_rank(self.consumed)}

    def start_line(self) -> str:
        v = self.versions
        return (f"ppo: {v.policy} v{v.version} (parent v{v.parent}) from offset {self.resume_offset}, "
                f"{dist.world()[1]} rank(s), batch {self.batch}, {self.config.epochs}x{self.config.minibatches} "
                f"steps/update, stale={self.config.stale} max-lag={self.config.max_version_lag}")

    def collect(self, source: Source) -> None:
        scanned = source.next_offset  # read first: everything received before it is polled below
        got = source.poll(timeout=0.05, max_items=4 * self.batch)
        if len(got) < 4 * self.batch:  # the queue was drained: the shard is consumed through `scanned`
            self.consumed = max(self.consumed, scanned)
        for t in got:
            self.consumed = max(self.consumed, t.offset + 1)
            self.reward_version = t.reward_version or self.reward_version
            if self.config.stale == "drop" and self.versions.version - t.policy_version > self.config.max_version_lag:
                self.dropped += 1  # too old to learn from: never assembled
                continue
            self.assembler.add(t)
        source.ack(self.consumed)

    def ready(self, backlog: float) -> bool:
        ahead = self.iteration - self.versions.served_progress
        return backlog >= self.batch and not (self.args.max_ahead and ahead >= self.args.max_ahead)

    def update(self) -> None:
        tick = time.monotonic()
        segments = self.assembler.take()
        if segments:
            self.probe = observations([t for seg in segments for t in seg.transitions][-PROBE:], self.obs_name)
        self.stats = self.learner.update(segments, newest_version=self.versions.version,
                                         newest_publish_ns=self.versions.publish_ns)
        self.update_s = time.monotonic() - tick
        self.iteration += 1
        self.samples += int(self.stats["global_kept"])
        episodes = self.assembler.take_episode_returns()
        self.sums = dist.all_reduce_sum(torch.tensor([float(len(episodes)), float(sum(r for r, _ in episodes)),
                                                      float(self.dropped)], dtype=torch.float64)).tolist()
        if self.sums[0] > 0:
            self.mean_return = self.sums[1] / self.sums[0]
            self.best_return = max(self.best_return, self.mean_return)

    def publication(self) -> Publication | None:
        offsets = dist.per_rank(self.consumed)
        probe = self._shared_probe()
        if probe is None:
            return None
        return Publication(progress=self.iteration, trainer_step=self.learner.steps, data_offset=max(offsets),
                           reward_version=self.reward_version, probe=probe)

    def report(self, elapsed: float) -> tuple[str, dict]:
        s, episodes = self.stats, int(self.sums[0])
        line = (f"ppo it {self.iteration} step {self.learner.steps} samples {self.samples} return "
                f"{self.mean_return:.1f} (n {episodes}) v{self.versions.version} lag {s['lag_versions_mean']:.2f}v "
                f"(max {int(s['lag_versions_max'])}) {s['lag_seconds_mean']:.2f}s stale "
                f"{int(s['stale']) + int(self.sums[2])} | pi {s['policy_loss']:.3f} v {s['value_loss']:.3f} "
                f"kl {s['approx_kl']:.4f} clip {s['clip_frac']:.2f} std {np.exp(s['log_std']):.2f} | "
                f"{s['global_kept'] / max(self.update_s, 1e-9):.0f} samples/s update, "
                f"{self.samples / max(elapsed, 1e-9):.0f} samples/s")
        return line, {"iteration": self.iteration, "samples": self.samples, "return": finite(self.mean_return),
                      "episodes": episodes, "update_s": self.update_s, **s}

    def summary(self, elapsed: float) -> dict:
        return {"iterations": self.iteration, "samples": self.samples, "mean_return": finite(self.mean_return),
                "best_return": finite(self.best_return),
                **{k: v for k, v in self.stats.items() if k.startswith("lag_") or k in ("stale", "approx_kl")}}

    def _shared_probe(self) -> np.ndarray | None:
        """The probe batch of the first rank that has one, on every rank (rank 0 may own no session)."""
        sizes = dist.per_rank(0 if self.probe is None else len(self.probe))
        src = next((r for r, n in enumerate(sizes) if n > 0), None)
        if src is None:
            return None
        buffer = torch.zeros(sizes[src], self.obs_width)
        if dist.world()[0] == src:
            buffer.copy_(torch.from_numpy(self.probe))
        return dist.broadcast_tensor(buffer, src=src).numpy()
