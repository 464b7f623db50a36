"""The training loop, once for every algorithm; what is particular to PPO, SAC and BC is an `Algorithm`
(trainer.algorithms). `trainer.worker` runs it on every rank: `summary = run(args, PPO)`.

Before the loop: fetch the served policy (with --gateway), build the algorithm on it, resume from the newest
checkpoint, open the stream it reads (`Experience.Subscribe`, or NATS JetStream with --experience). Each pass:
the algorithm takes new transitions (`collect`); one all-reduce carries every rank's stop vote (--steps,
--seconds, --target-return, --stop-file), what it has ready to learn from (`backlog`) and rank 0's publish
outcome, so the ranks stop, update and learn versions together; rank 0 submits the newest queued publish once
its background publisher is free; when `ready`, the algorithm updates and, on its `schedule`, a publish is
queued (`publication`), a checkpoint written (its `state` beside the versions) and the stream committed (NATS
forgets only what a written checkpoint holds). At the end: the publish in flight (and BC's final one) is waited
for, a last checkpoint written, rank 0 writes --out, and the summary is returned.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from bridge.client import Credentials, PoliciesClient, ServedPolicy
from bridge.client.weights import to_safetensors
from bridge.common.files import write_atomic
from bridge.experience.jetstream import nats_auth_from
from protos import codec, experience_pb2
from trainer import checkpoint, dist
from trainer.nats_source import JetStreamSource
from trainer.publisher import Publication, PublishQueue, Versions
from trainer.sources import StreamSource
from trainer.weights import build_policy, hidden_sizes

__all__ = ["Algorithm", "Learner", "Schedule", "Source", "finite", "observations", "run", "served_module", "status"]

Source = StreamSource | JetStreamSource  # `ack`: the gateway's flow control; `commit`: what the stream may forget


class Learner(Protocol):
    """An algorithm's optimiser side: trainer.ppo.PPOLearner, trainer.sac.SACLearner, trainer.bc.BCLearner."""

    policy: torch.nn.Module            # the served policy being trained: published, written to --out
    model: torch.nn.Module             # what a checkpoint holds: the policy and what trains it (critics, ...)
    optimizer: torch.optim.Optimizer
    steps: int                         # optimiser steps (--steps)


@dataclass(frozen=True)
class Schedule:
    """When the loop acts for an algorithm, counted in its `progress` (PPO: updates; SAC, BC: optimiser steps)."""

    checkpoint_every: int
    publish_every: int = 0             # 0: never during the run
    publish_at_end: bool = False       # one publish after the last update, which must succeed (BC)
    report_each_update: bool = False   # a status line per update (PPO), else one every --status-every seconds


class Algorithm(Protocol):
    """What is particular to one algorithm (trainer.algorithms.PPO, SAC, BC subclass it for its defaults: no
    stream, ready every pass, progress in optimiser steps); built as `cls(args, served, versions)` (served: None
    without --gateway), then driven by `run`. `publication` and `state` are called on every rank (collectives)."""

    name: str                          # "ppo": the lineage's and checkpoint's algo
    learner: Learner
    schedule: Schedule
    generator: torch.Generator | None = None  # a generator of its own that checkpoints keep beside torch's
    window = 0                         # transitions the stream may send ahead unacknowledged; 0: reads none
    resume_offset = 0                  # where `Experience.Subscribe` starts
    mean_return = float("nan")         # --target-return's measure
    backlog = 1.0                      # what this rank has ready to learn from (summed over ranks for `ready`)

    @property
    def progress(self) -> int:
        return self.learner.steps

    def restore(self, meta: dict) -> None:
        """Counters and data position from a checkpoint's meta (what `state` wrote)."""

    def state(self) -> dict:
        return {}

    def collect(self, source: Source) -> None:
        """Poll the stream, keep what it learns from, ack what it consumed."""

    def ready(self, backlog: float) -> bool:
        return True

    def start_line(self) -> str: ...

    def update(self) -> None: ...

    def publication(self) -> Publication | None: ...  # None: nothing to probe with yet

    def report(self, elapsed: float) -> tuple[str, dict | None]: ...  # a status line, a --metrics row (or None)

    def summary(self, elapsed: float) -> dict: ...


def run(args: argparse.Namespace, make: Callable[[argparse.Namespace, ServedPolicy | None, Versions], Algorithm]
        ) -> dict:
    """Train with the algorithm `make` builds until a stop condition; returns the summary (see module docstring)."""
    rank, _ = dist.world()
    client = PoliciesClient(args.gateway, Credentials.from_env()) if args.gateway else None
    try:
        served = client.fetch(args.policy) if client is not None else None
        versions = Versions.of(served, args.policy)
        algo = make(args, served, versions)
        saved_step = _resume(args, algo, versions, client)
        status(algo.start_line())
        source = _open(args, algo, served) if algo.window else None
        publishes = PublishQueue(client, versions, algo.name, served.inputs[0].name) \
            if served is not None and rank == 0 else None  # served: there is a client
        try:
            started = time.monotonic()
            _loop(args, algo, versions, source, publishes, started, saved_step)
            elapsed = time.monotonic() - started
        finally:
            if source is not None:
                source.close()
            if publishes is not None:
                publishes.close()
    finally:
        if client is not None:
            client.close()
    summary = {"steps": algo.learner.steps, **algo.summary(elapsed), "parent_version": versions.parent,
               "final_version": versions.version, "published_versions": versions.published,
               "param_sha256": dist.param_digests(algo.learner.model)}
    if algo.schedule.publish_at_end:
        summary["published_version"] = versions.version
    if source is not None:
        summary.update(reconnects=source.reconnects, skipped=source.skipped)  # skipped: unusable transitions
    if args.out and rank == 0:
        write_atomic(args.out, to_safetensors(algo.learner.policy.state_dict()), mode=0o644)
    return summary


def _loop(args: argparse.Namespace, algo: Algorithm, versions: Versions, source: Source | None,
          publishes: PublishQueue | None, started: float, saved_step: int) -> None:
    schedule, last_status = algo.schedule, started
    while True:
        if source is not None:
            algo.collect(source)
        elapsed = time.monotonic() - started
        stop = ((args.steps and algo.learner.steps >= args.steps) or (args.seconds and elapsed >= args.seconds)
                or (args.target_return is not None and algo.mean_return >= args.target_return)
                or (args.stop_file and os.path.exists(args.stop_file)))
        code, progress = publishes.outcome() if publishes is not None else (0, 0)
        backlog, stop_votes, code, progress = dist.all_reduce_sum(torch.tensor(
            [algo.backlog, float(bool(stop)), float(code), float(progress)], dtype=torch.float64)).tolist()
        versions.learn(int(code), int(progress))
        if stop_votes > 0 and schedule.publish_at_end:
            _queue(algo, publishes)
        if publishes is not None:
            publishes.submit()
        if stop_votes > 0:
            break
        updated = algo.ready(backlog)
        if updated:
            before = algo.progress
            algo.update()
            _maybe_fail(args, algo.learner.steps)
            if schedule.publish_every and _crossed(before, algo.progress, schedule.publish_every):
                _queue(algo, publishes)
            if args.checkpoint_dir and _crossed(before, algo.progress, schedule.checkpoint_every):
                saved_step = _save(args, algo, versions, source)
            elif source is not None and not args.checkpoint_dir:
                source.commit()
        now = time.monotonic()
        if updated if schedule.report_each_update else now - last_status >= args.status_every:
            last_status = now
            _report(args, algo, versions, now - started)
    code, progress = publishes.outcome(wait=True) if publishes is not None else (0, 0)
    code, progress = dist.all_reduce_sum(torch.tensor([float(code), float(progress)], dtype=torch.float64)).tolist()
    versions.learn(int(code), int(progress))
    if schedule.publish_at_end and code <= 0:
        raise RuntimeError("the final publish failed (see rank 0's log)")
    if args.checkpoint_dir and algo.learner.steps and algo.learner.steps != saved_step:
        _save(args, algo, versions, source)


def _queue(algo: Algorithm, publishes: PublishQueue | None) -> None:
    publication = algo.publication()  # on every rank: it may be a collective
    if publishes is not None and publication is not None:
        publishes.queue(publication, algo.learner.policy)


def _crossed(before: int, after: int, every: int) -> bool:
    """Did progress pass a multiple of `every`?"""
    return after // every > before // every


def _save(args: argparse.Namespace, algo: Algorithm, versions: Versions, source: Source | None) -> int:
    """A checkpoint (every rank), then the stream may forget what it holds; returns its step."""
    learner = algo.learner
    meta = {"algo": algo.name, **versions.meta(), **algo.state()}
    rng = {"torch": torch.get_rng_state()}
    if algo.generator is not None:
        rng["generator"] = algo.generator.get_state()
    checkpoint.save(args.checkpoint_dir, step=learner.steps, model=learner.model, optimizer=learner.optimizer,
                    meta=meta, rng=rng)
    if source is not None:
        source.commit()
    return learner.steps


def _resume(args: argparse.Namespace, algo: Algorithm, versions: Versions, client: PoliciesClient | None) -> int:
    """Load the newest checkpoint under --checkpoint-dir, if any; returns its step (0: none)."""
    ckpt = checkpoint.load(args.checkpoint_dir, map_location=dist.device()) if args.checkpoint_dir else None
    if ckpt is None:
        return 0
    status(f"resuming from {ckpt.path} (step {ckpt.step}, restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
           f", world {dist.world()[1]} (was {ckpt.meta.get('world_size', '?')}))")
    learner = algo.learner
    learner.model.load_state_dict(ckpt.model, strict=True)
    learner.optimizer.load_state_dict(ckpt.optimizer)
    learner.steps = ckpt.step
    if "torch" in ckpt.rng:
        torch.set_rng_state(ckpt.rng["torch"])
    if algo.generator is not None and "generator" in ckpt.rng:
        algo.generator.set_state(ckpt.rng["generator"])
    versions.restore(ckpt.meta)
    algo.restore(ckpt.meta)
    if client is not None:
        versions.catch_up(client.list(versions.policy), learner.policy.state_dict())
    versions.served_progress = algo.progress
    return ckpt.step


def _open(args: argparse.Namespace, algo: Algorithm, served: ServedPolicy) -> Source:
    """This rank's shard of the stream: the NATS stream with --experience (a durable consumer per rank that keeps
    the position), else the gateway's Experience.Subscribe from `algo.resume_offset`."""
    rank, world = dist.world()
    expect = (*served.inputs, *served.outputs)
    if args.experience:
        return JetStreamSource(args.experience, durable=f"tether-train-{served.policy}-r{rank}", shard=rank,
                               num_shards=world, policy=served.policy, window=max(16 * algo.window, 65536),
                               expect=expect, auth=nats_auth_from(args))
    return StreamSource(args.gateway, from_offset=algo.resume_offset, shard=rank, num_shards=world,
                        policy=served.policy, window=algo.window, expect=expect)


def _report(args: argparse.Namespace, algo: Algorithm, versions: Versions, elapsed: float) -> None:
    line, row = algo.report(elapsed)
    if args.metrics and row is not None and dist.world()[0] == 0:
        with open(args.metrics, "a") as f:
            f.write(json.dumps({"t": time.time(), "elapsed_s": elapsed, "steps": algo.learner.steps,
                                "version": versions.version, **row}, sort_keys=True) + "\n")
    status(line)


def _maybe_fail(args: argparse.Namespace, step: int) -> None:
    """Test hook: rank `--fail-rank` dies at `--fail-at-step`, only in torchrun's first attempt."""
    if (args.fail_at_step and step >= args.fail_at_step and dist.world()[0] == args.fail_rank
            and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"):
        print(f"[trainer] rank {args.fail_rank}: failing on purpose at step {step}", file=sys.stderr, flush=True)
        os._exit(17)


def status(line: str) -> None:
    """A status line on stderr (rank 0's)."""
    if dist.world()[0] == 0:
        print(f"[trainer] {line}", file=sys.stderr, flush=True)


def served_module(arch: str, served: ServedPolicy, *, seed: int) -> torch.nn.Module:
    """The network `arch` holding the served version's weights."""
    if arch == "camera":  # its convolutions' and head's sizes are read from the weights
        from trainer.camera_policy import camera_policy_for

        policy = camera_policy_for(served.inputs, served.outputs, state_dict=served.state_dict, seed=seed)
    else:
        policy = build_policy(arch, served.inputs, served.outputs, hidden=hidden_sizes(served.state_dict), seed=seed)
    policy.load_state_dict(served.state_dict, strict=True)
    return policy


def observations(transitions: Sequence[experience_pb2.Transition], name: str) -> np.ndarray:
    """The observation tensor `name` of each transition, as rows (float32): a probe batch."""
    return np.stack([next(codec.decode(x) for x in t.observation if x.name == name).reshape(-1).astype(np.float32)
                     for t in transitions])


def finite(x: float) -> float | None:
    """`x`, or None for NaN/inf (JSON has neither)."""
    return x if math.isfinite(x) else None
