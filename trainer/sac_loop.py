"""The SAC loop (one rank): seed the replay from logs -> live `Experience.Subscribe` -> SAC updates at a
replay ratio -> publish every K updates through the gate -> checkpoints.

    tether train --algo sac --gateway 127.0.0.1:50051 --policy invertedpendulum_v5 --nproc 1 \\
        --seed-log runs/old/experience --demos runs/teleop/experience --utd 1 --publish-every 250 --seconds 300

The replay (trainer.replay) is a cache of the log: the online half fills from the stream (the gateway
replays its log from `--from-offset`, then goes live), the offline half from `--seed-log` / `--demos`
MCAP segments read at start and from every intervention the stream carries. After a restart the
learner resumes from its checkpoint (networks, optimisers, temperature, counters) and subscribes again
from `buffer-size` transitions before the offset it had consumed, so the buffer refills from the log
(those refill rows do not count towards the replay ratio).
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np

from bridge.client import Credentials, PoliciesClient
from protos import policies_pb2
from trainer import checkpoint, dist
from trainer.publisher import FATAL, RETRY, BackgroundPublisher, served_version_of
from trainer.replay import MixedReplay, ReplayAdder
from trainer.sac import SACConfig, SACLearner
from trainer.sources import LogDataset, StreamSource, _misfit
from trainer.weights import build_policy, hidden_sizes
from trainer.worker import (
    load_checkpoint,
    maybe_fail,
    param_digests,
    probe_outputs,
    restore_rng,
    rng_state,
    status,
    stop_requested,
    trainer_id,
    write_weights,
)

__all__ = ["run_sac", "seed_replay"]

PROBE = 16
CHUNK = 16  # updates between polls of the stream


def seed_replay(adder: ReplayAdder, directories: list[str], *, policy: str | None, expect) -> int:
    """Every usable transition of the MCAP segments under `directories` into `adder`; returns how many."""
    expected = {s.name: s for s in expect}
    count = 0
    for directory in directories:
        for t in LogDataset(directory, policy=policy).transitions:
            if _misfit(t, expected) is None:
                adder.add(t)
                count += 1
    return count


def run_sac(args: argparse.Namespace) -> dict:
    rank, world = dist.world()
    if world > 1:
        raise ValueError(f"--algo sac runs on one rank (give --nproc 1), this group has {world}")
    client = PoliciesClient(args.gateway, Credentials.from_env())
    served = client.fetch(args.policy)
    policy = build_policy("gaussian", served.inputs, served.outputs, hidden=hidden_sizes(served.state_dict),
                          seed=args.seed)
    policy.load_state_dict(served.state_dict, strict=True)
    obs_name, act_name = served.inputs[0].name, served.outputs[0].name
    expect = (*served.inputs, *served.outputs)
    config = SACConfig(gamma=args.gamma, tau=args.tau, actor_lr=args.lr, critic_lr=args.lr, alpha_lr=args.lr,
                       init_alpha=args.init_alpha, critic_hidden=args.critic_hidden)
    learner = SACLearner(policy, config=config, seed=args.seed)
    replay = MixedReplay(capacity=args.buffer_size, observation_size=learner.obs_size, action_size=learner.act_size)
    seeds = ReplayAdder(replay, observation=obs_name, action=act_name, offline=True)
    demos = ReplayAdder(replay, observation=obs_name, action=act_name, demos=True)
    seeded = seed_replay(seeds, args.seed_log, policy=args.data_policy, expect=expect)
    seeded += seed_replay(demos, args.demos, policy=args.data_policy, expect=expect)
    buffer_at_start = len(replay)
    rng = np.random.default_rng(args.seed)
    version = parent = served.version
    consumed, published, updates_done_at_publish = args.from_offset, [], 0
    ckpt = load_checkpoint(args)
    if ckpt is not None:
        learner.model.load_state_dict(ckpt.model, strict=True)
        learner.optimizer.load_state_dict(ckpt.optimizer)
        learner.steps = ckpt.step
        restore_rng(ckpt.rng)
        meta = ckpt.meta
        rng.bit_generator.state = meta["np_rng"]
        version, parent, published, consumed = meta["version"], meta["parent"], meta["published"], meta["offset"]
        updates_done_at_publish = learner.steps
        listing = client.list(served.policy)
        match = served_version_of(listing, learner.policy.state_dict())
        if match is not None and match.version > version:
            version, published = match.version, [*published, match.version]
        version = max(version, listing.newest)  # a publish that finished after the checkpoint: the chain goes on
    refill_until = consumed  # transitions before it were learned from before a restart: refill only
    start = max(args.from_offset, consumed - args.buffer_size) if ckpt is not None else args.from_offset
    batch = args.batch or 256
    every = args.checkpoint_every or 1000
    publish_every = args.publish_every
    status(f"sac: {served.policy} v{version} (parent v{parent}) from offset {start}, batch {batch}, utd {args.utd:g}, "
           f"publish every {publish_every} updates, seeded {seeded} transitions -> {buffer_at_start} rows "
           f"({len(replay.offline)} offline, {demos.rows} demonstration rows), step {learner.steps}")
    publisher = BackgroundPublisher(client, served.policy)
    source = StreamSource(args.gateway, from_offset=start, policy=served.policy, window=max(4 * batch, 8192),
                          expect=expect)
    live = ReplayAdder(replay, observation=obs_name, action=act_name)
    returns: collections.deque[float] = collections.deque(maxlen=20)
    best, due, fresh_rows, reward_version = float("-inf"), 0.0, 0, ""
    started = last_status = time.monotonic()
    stats: dict[str, float] = {}
    retry_at = 0.0
    try:
        while True:
            got = source.poll(timeout=0.0 if due >= 1 else 0.05, max_items=8192)
            rows_before = live.rows
            for t in got:
                live.add(t)
                reward_version = t.reward_version or reward_version
                if t.offset >= refill_until:
                    fresh_rows += 1
            if got:
                consumed = max(consumed, got[-1].offset + 1)
                source.ack(consumed)
                if got[-1].offset >= refill_until:
                    due = min(due + args.utd * (live.rows - rows_before), float(max(publish_every, 4 * CHUNK)))
            returns.extend(live.take_episode_returns())
            mean_return = float(np.mean(returns)) if returns else float("nan")
            best = max(best, mean_return) if returns else best
            elapsed = time.monotonic() - started
            if ((args.steps and learner.steps >= args.steps) or (args.seconds and elapsed >= args.seconds)
                    or (args.target_return is not None and len(returns) and mean_return >= args.target_return)
                    or stop_requested(args)):
                break
            code = publisher.result()
            if code == FATAL:
                raise RuntimeError("publishing failed (see the log above)")
            if code == RETRY:
                retry_at = time.monotonic() + 1.0
            elif code > 0:
                version = code
                published.append(code)
            if len(replay) >= max(args.learning_starts, 1) and due >= 1:
                steps_before = learner.steps
                for _ in range(min(int(due), CHUNK)):
                    stats = learner.update(replay.sample(batch, rng))
                    due -= 1
                    if (args.steps and learner.steps >= args.steps) or learner.steps % every == 0:
                        break  # a checkpoint's step is a multiple of --checkpoint-every
                maybe_fail(args, learner.steps)
                if args.checkpoint_dir and learner.steps // every > steps_before // every:
                    checkpoint.save(args.checkpoint_dir, step=learner.steps, model=learner.model,
                                    optimizer=learner.optimizer, rng=rng_state(),
                                    meta={"algo": "sac", "version": version, "parent": parent, "published": published,
                                          "offset": consumed, "np_rng": rng.bit_generator.state})
            if (publish_every and learner.steps - updates_done_at_publish >= publish_every and publisher.idle
                    and time.monotonic() >= retry_at):
                updates_done_at_publish = learner.steps
                probe = replay.sample(PROBE, rng)["observation"]
                publisher.submit(learner.policy.state_dict(), lineage=policies_pb2.Lineage(
                    parent_version=version, trainer_step=learner.steps, data_offset=consumed,
                    reward_version=reward_version, trainer=trainer_id("sac"), algo="sac"),
                    probe_inputs={obs_name: probe}, probe_outputs=probe_outputs(learner.policy, probe))
            now = time.monotonic()
            if now - last_status >= args.status_every:
                last_status = now
                line = (f"sac step {learner.steps} rows {fresh_rows} buffer {len(replay.online)}+"
                        f"{len(replay.offline)} return {mean_return:.1f} (n {len(returns)}) v{version} "
                        f"utd {learner.steps / max(fresh_rows, 1):.2f} interventions {live.interventions}")
                if stats:
                    line += (f" | q {stats['q']:.2f} critic {stats['critic_loss']:.3f} alpha {stats['alpha']:.3f} "
                             f"std {np.exp(stats['log_std']):.2f}")
                status(line)
                if args.metrics:
                    _append_metrics(args.metrics, {"t": time.time(), "elapsed_s": now - started,
                                                   "steps": learner.steps, "rows": fresh_rows,
                                                   "return": _finite(mean_return), "version": version, **stats})
        final = publisher.result(wait=True)
        if final > 0:
            version = final
            published.append(final)
    finally:
        source.close()
        publisher.close()
        client.close()
    if args.checkpoint_dir and learner.steps:
        checkpoint.save(args.checkpoint_dir, step=learner.steps, model=learner.model, optimizer=learner.optimizer,
                        rng=rng_state(), meta={"algo": "sac", "version": version, "parent": parent,
                                               "published": published, "offset": consumed,
                                               "np_rng": rng.bit_generator.state})
    if args.out:
        write_weights(args.out, learner.policy.state_dict())
    return {"steps": learner.steps, "rows": fresh_rows, "seeded": seeded, "buffer_at_start": buffer_at_start,
            "offline_rows": len(replay.offline), "online_rows": len(replay.online), "demo_rows": demos.rows,
            "interventions": live.interventions, "final_version": version, "parent_version": parent,
            "published_versions": published, "mean_return": _finite(float(np.mean(returns)) if returns else
                                                                    float("nan")),
            "best_return": _finite(best), "param_sha256": param_digests(learner.model),
            "reconnects": source.reconnects, "skipped": source.skipped}


def _append_metrics(path: str, row: dict) -> None:
    import json

    with open(path, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


def _finite(x: float) -> float | None:
    return x if np.isfinite(x) else None
