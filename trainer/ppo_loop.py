"""The PPO loop of one rank: stream shard -> trajectories -> PPO update -> publish -> checkpoint.

All ranks meet in one small all-reduce per poll (ready transitions, stop flag), so they update
together and take the same number of optimiser steps. Rank 0 publishes in the background (the
gateway takes seconds to load and verify a version); every rank learns the new version at the
next iteration (broadcast), which the lag figures of the next batches are measured against.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bridge.client import Credentials, PoliciesClient
from protos import policies_pb2
from trainer import checkpoint, dist
from trainer.ppo import PPOConfig, PPOLearner
from trainer.publisher import FATAL, RETRY, BackgroundPublisher, served_version_of
from trainer.sources import StreamSource
from trainer.trajectory import TrajectoryAssembler
from trainer.weights import build_policy, hidden_sizes
from trainer.worker import (
    load_checkpoint,
    maybe_fail,
    param_digests,
    per_rank,
    probe_outputs,
    restore_rng,
    rng_state,
    status,
    stop_requested,
    trainer_id,
    write_weights,
)

__all__ = ["run_ppo"]

PROBE = 16


def run_ppo(args: argparse.Namespace) -> dict:
    rank, world = dist.world()
    if args.max_ahead and args.publish_every != 1:
        raise ValueError(f"--max-ahead {args.max_ahead} needs --publish-every 1, got {args.publish_every}")
    client = PoliciesClient(args.gateway, Credentials.from_env())
    served = client.fetch(args.policy)
    policy = build_policy(args.arch, served.inputs, served.outputs, hidden=hidden_sizes(served.state_dict),
                          seed=args.seed)
    policy.load_state_dict(served.state_dict, strict=True)
    obs_name, act_name = served.inputs[0].name, served.outputs[0].name
    config = PPOConfig(gamma=args.gamma, lam=args.lam, clip=args.clip, epochs=args.epochs,
                       minibatches=args.minibatches, lr=args.lr, entropy_coef=args.entropy_coef, stale=args.stale,
                       target_kl=args.target_kl,
                       max_version_lag=args.max_version_lag, rho_max=args.rho_max, bf16=args.bf16,
                       normalize_obs=args.obs_norm, normalize_value=args.value_norm)
    learner = PPOLearner(policy, config=config, observation=obs_name, action=act_name, seed=args.seed)
    version, parent = served.version, served.version
    publish_ns = served.published_unix_ns or time.time_ns()
    offset, iteration, samples, published = args.from_offset, 0, 0, []
    ckpt = load_checkpoint(args)
    if ckpt is not None:
        learner.model.load_state_dict(ckpt.model, strict=True)
        learner.optimizer.load_state_dict(ckpt.optimizer)
        learner.steps = ckpt.step
        restore_rng(ckpt.rng, learner.generator)
        meta = ckpt.meta
        version, parent, publish_ns = meta["version"], meta["parent"], meta["publish_ns"]
        iteration, samples, published = meta["iteration"], meta["samples"], meta["published"]
        offsets = meta["offsets"]
        offset = offsets[rank] if len(offsets) == world else min(offsets)
        # a publish may have finished after this checkpoint: the weights then have a served version
        match = served_version_of(client.list(served.policy), learner.policy.state_dict())
        if match is not None and match.version > version:
            version, publish_ns = match.version, match.published_unix_ns or publish_ns
            published = [*published, match.version]
    batch = args.batch or 1024
    every = args.checkpoint_every or 1
    status(f"ppo: {served.policy} v{version} (parent v{parent}) from offset {offset}, {world} rank(s), "
           f"batch {batch}, {config.epochs}x{config.minibatches} steps/update, stale={config.stale} "
           f"max-lag={config.max_version_lag}")
    publisher = BackgroundPublisher(client, served.policy)
    if args.experience:  # the JetStream stream: this rank's durable consumer keeps the position (trainer.nats_source)
        from bridge.experience.jetstream import nats_auth_from
        from trainer.nats_source import JetStreamSource

        source = JetStreamSource(args.experience, durable=f"tether-train-{served.policy}-r{rank}", shard=rank,
                                 num_shards=world, policy=served.policy, window=max(64 * batch, 65536),
                                 expect=(*served.inputs, *served.outputs), auth=nats_auth_from(args))
    else:
        source = StreamSource(args.gateway, from_offset=offset, shard=rank, num_shards=world, policy=served.policy,
                              window=max(4 * batch, 4096), expect=(*served.inputs, *served.outputs))
    assembler = TrajectoryAssembler()
    consumed, dropped, last_return, best_return = offset, 0, float("nan"), float("-inf")
    probe: np.ndarray | None = None
    reward_version = ""
    started = time.monotonic()
    stats: dict[str, float] = {}
    pending: dict | None = None      # rank 0: the newest update's weights, not yet submitted
    submitted: dict | None = None    # rank 0: the publish in flight (or last finished)
    served_iteration = iteration     # the update whose weights the sessions act with
    retry_at = 0.0                   # rank 0: after a retryable failure, publish again from then on
    try:
        while True:
            scanned = source.next_offset  # read first: everything received before it is polled below
            got = source.poll(timeout=0.05, max_items=4 * batch)
            if len(got) < 4 * batch:  # the queue was drained: the shard is consumed through `scanned`
                consumed = max(consumed, scanned)
            for t in got:
                consumed = max(consumed, t.offset + 1)
                reward_version = t.reward_version or reward_version
                if config.stale == "drop" and version - t.policy_version > config.max_version_lag:
                    dropped += 1  # too old to learn from: never assembled
                    continue
                assembler.add(t)
            source.ack(consumed)
            elapsed = time.monotonic() - started
            target = args.target_return is not None and last_return >= args.target_return
            stop = ((args.steps and learner.steps >= args.steps) or (args.seconds and elapsed >= args.seconds)
                    or target or stop_requested(args))
            code, code_iteration = 0, 0
            if rank == 0:
                code = publisher.result()
                if code == RETRY and submitted is not None:
                    pending = pending or submitted  # nothing newer: publish the same weights again
                    retry_at = time.monotonic() + 1.0
                code_iteration = submitted["iteration"] if code > 0 and submitted is not None else 0
            ready, stop_votes, code, code_iteration = dist.all_reduce_sum(torch.tensor(
                [float(assembler.ready), float(bool(stop)), float(code), float(code_iteration)],
                dtype=torch.float64)).tolist()
            version, publish_ns = _collect(int(code), version, publish_ns, published)
            if code > 0:
                served_iteration = int(code_iteration)
            if rank == 0 and pending is not None and publisher.idle and time.monotonic() >= retry_at:
                submitted, pending = pending, None
                publisher.submit(submitted["state_dict"],
                                 lineage=policies_pb2.Lineage(parent_version=version, **submitted["lineage"]),
                                 probe_inputs=submitted["probe_inputs"], probe_outputs=submitted["probe_outputs"])
            if stop_votes > 0:
                break
            if ready < batch or (args.max_ahead and iteration - served_iteration >= args.max_ahead):
                continue  # not enough data, or too far ahead of what the sessions act with
            tick = time.monotonic()
            segments = assembler.take()
            if segments:
                rows = [t for seg in segments for t in seg.transitions][-PROBE:]
                probe = np.stack([_obs(t, obs_name) for t in rows])
            stats = learner.update(segments, newest_version=version, newest_publish_ns=publish_ns)
            update_s = time.monotonic() - tick
            iteration += 1
            samples += int(stats["global_kept"])
            episodes = assembler.take_episode_returns()
            sums = dist.all_reduce_sum(torch.tensor([float(len(episodes)), float(sum(r for r, _ in episodes)),
                                                     float(dropped)], dtype=torch.float64)).tolist()
            if sums[0] > 0:
                last_return = sums[1] / sums[0]
                best_return = max(best_return, last_return)
            maybe_fail(args, learner.steps)
            if args.publish_every and iteration % args.publish_every == 0:
                offsets = per_rank(consumed)
                shared = _shared_probe(probe, served.inputs[0].shape[0])
                if rank == 0 and shared is not None:  # submitted once the publisher is free (newest wins)
                    pending = {"iteration": iteration, "state_dict": _snapshot(learner.policy),
                               "lineage": {"trainer_step": learner.steps, "data_offset": max(offsets),
                                           "reward_version": reward_version, "trainer": trainer_id("ppo"),
                                           "algo": "ppo"},
                               "probe_inputs": {obs_name: shared},
                               "probe_outputs": probe_outputs(learner.policy, shared)}
            if args.checkpoint_dir and iteration % every == 0:
                checkpoint.save(args.checkpoint_dir, step=learner.steps, model=learner.model,
                                optimizer=learner.optimizer,
                                meta={"algo": "ppo", "version": version, "parent": parent, "publish_ns": publish_ns,
                                      "iteration": iteration, "samples": samples, "published": published,
                                      "offsets": per_rank(consumed)},
                                rng=rng_state(learner.generator))
            if args.experience and (not args.checkpoint_dir or iteration % every == 0):
                source.commit()  # the checkpoint holding this update is written: the stream may forget its data
            if args.metrics and rank == 0:
                _append_metrics(args.metrics, {
                    "t": time.time(), "elapsed_s": time.monotonic() - started, "iteration": iteration,
                    "steps": learner.steps, "samples": samples, "return": _finite(last_return),
                    "episodes": int(sums[0]), "version": version, "update_s": update_s, **stats})
            status(f"ppo it {iteration} step {learner.steps} samples {samples} return {last_return:.1f} "
                   f"(n {int(sums[0])}) v{version} lag {stats['lag_versions_mean']:.2f}v "
                   f"(max {int(stats['lag_versions_max'])}) {stats['lag_seconds_mean']:.2f}s stale "
                   f"{int(stats['stale']) + int(sums[2])} | pi {stats['policy_loss']:.3f} "
                   f"v {stats['value_loss']:.3f} kl {stats['approx_kl']:.4f} clip {stats['clip_frac']:.2f} "
                   f"std {np.exp(stats['log_std']):.2f} | {stats['global_kept'] / max(update_s, 1e-9):.0f} "
                   f"samples/s update, {samples / max(time.monotonic() - started, 1e-9):.0f} samples/s")
        final = publisher.result(wait=True) if rank == 0 else 0
        version, publish_ns = _collect(int(dist.all_reduce_sum(torch.tensor([float(final)])).item()), version,
                                       publish_ns, published)
    finally:
        source.close()
        publisher.close()
        client.close()
    summary = {"steps": learner.steps, "iterations": iteration, "samples": samples, "final_version": version,
               "parent_version": parent, "published_versions": published, "mean_return": _finite(last_return),
               "best_return": _finite(best_return), "param_sha256": param_digests(learner.model),
               "reconnects": source.reconnects, "skipped": source.skipped}  # unusable transitions (sources)
    summary.update({k: v for k, v in stats.items() if k.startswith("lag_") or k in ("stale", "approx_kl")})
    if args.out and rank == 0:
        write_weights(args.out, learner.policy.state_dict())
    return summary


def _collect(code: int, version: int, publish_ns: int, published: list[int]) -> tuple[int, int]:
    """Every rank learns the outcome `code` of rank 0's finished publish (the same on every rank):
    (newest version, its publish time)."""
    if code == FATAL:
        raise RuntimeError("publishing failed (see rank 0's log)")
    if code > 0:
        published.append(code)
        return code, dist.broadcast_int(time.time_ns())
    return version, publish_ns


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}


def _shared_probe(probe: np.ndarray | None, width: int) -> np.ndarray | None:
    """The probe batch of the first rank that has one, on every rank (rank 0 may own no session)."""
    sizes = per_rank(0 if probe is None else len(probe))
    src = next((r for r, n in enumerate(sizes) if n > 0), None)
    if src is None:
        return None
    buffer = torch.zeros(sizes[src], width)
    if dist.world()[0] == src:
        buffer.copy_(torch.from_numpy(probe))
    return dist.broadcast_tensor(buffer, src=src).numpy()


def _obs(t, name: str) -> np.ndarray:
    from protos import codec

    return next(codec.decode(x) for x in t.observation if x.name == name).reshape(-1).astype(np.float32)


def _append_metrics(path: str, row: dict) -> None:
    import json

    with open(path, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")


def _finite(x: float) -> float | None:
    return x if np.isfinite(x) else None
