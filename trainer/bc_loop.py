"""The BC loop of one rank: LogDataset batches -> BCLearner steps -> checkpoints -> publish at the end.

Step s reads batch (s mod batches_per_epoch) of epoch (s div batches_per_epoch): the data
position is a function of the step, so a resumed run reads exactly what the lost run would have.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from bridge.client import Credentials, PoliciesClient
from protos import policies_pb2
from protos.codec import Spec
from trainer import checkpoint, dist
from trainer.bc import BCConfig, BCLearner
from trainer.policy import GaussianPolicy
from trainer.sources import LogDataset
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

__all__ = ["run_bc"]


def _specs_from_log(dataset: LogDataset) -> tuple[Spec, Spec]:
    t = dataset.transitions[0]
    if len(t.observation) != 1 or not (t.applied_action or t.action):
        raise ValueError(f"offline BC needs one observation tensor and an action per transition; offset "
                         f"{t.offset} has {[x.name for x in t.observation]} -> {[x.name for x in t.action]}")
    obs = t.observation[0]
    act = (t.applied_action or t.action)[0]
    return (Spec(obs.name, np.float32, (int(np.prod(obs.shape)),)),
            Spec(act.name, np.float32, (int(np.prod(act.shape)),)))


def run_bc(args: argparse.Namespace) -> dict:
    rank, world = dist.world()
    dataset = LogDataset(args.experience_dir, rank=rank, world_size=world, seed=args.seed, policy=args.data_policy)
    client = PoliciesClient(args.gateway, Credentials.from_env()) if args.gateway else None
    parent, policy_name = 0, args.policy
    if client is not None:
        served = client.fetch(args.policy)
        policy = build_policy(args.arch, served.inputs, served.outputs, hidden=hidden_sizes(served.state_dict),
                              seed=args.seed)
        policy.load_state_dict(served.state_dict, strict=True)
        obs_spec, act_spec = served.inputs[0], served.outputs[0]
        parent, policy_name = served.version, served.policy
    else:
        obs_spec, act_spec = _specs_from_log(dataset)
        outputs = (act_spec,) if args.arch == "mlp" else GaussianPolicy.output_specs(act_spec)
        policy = build_policy(args.arch, (obs_spec,), outputs, hidden=args.hidden, seed=args.seed)
    learner = BCLearner(policy, config=BCConfig(lr=args.lr, bf16=args.bf16), observation=obs_spec.name,
                        action=act_spec.name)
    batch = args.batch or 256
    per_epoch = math.ceil(dataset.per_rank() / batch)
    if per_epoch == 0:
        raise ValueError(f"{len(dataset)} transitions cannot feed {world} ranks")
    every = args.checkpoint_every or 50
    ckpt = load_checkpoint(args)
    if ckpt is not None:
        learner.model.load_state_dict(ckpt.model, strict=True)
        learner.optimizer.load_state_dict(ckpt.optimizer)
        learner.steps = ckpt.step
        restore_rng(ckpt.rng)
    status(f"bc: {len(dataset)} transitions in {len(dataset.segments)} segment(s) ({dataset.skipped} unusable "
           f"skipped), {dataset.per_rank()} per rank, batch {batch}, {per_epoch} steps/epoch, "
           f"from step {learner.steps}")
    started = last_status = time.monotonic()
    loss, samples = float("nan"), 0
    while True:
        elapsed = time.monotonic() - started
        stop = ((args.steps and learner.steps >= args.steps) or (args.seconds and elapsed >= args.seconds)
                or stop_requested(args))
        if dist.all_reduce_sum(torch.tensor([1.0 if stop else 0.0]))[0] > 0:
            break
        epoch, index = divmod(learner.steps, per_epoch)
        chunk = next(dataset.batches(batch, epoch=epoch, start=index * batch))
        stats = learner.update(chunk)
        loss, samples = stats["loss"], samples + len(chunk)
        maybe_fail(args, learner.steps)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if args.checkpoint_dir and learner.steps % every == 0:
            checkpoint.save(args.checkpoint_dir, step=learner.steps, model=learner.model,
                            optimizer=learner.optimizer, meta={"algo": "bc", "epoch": epoch, "parent": parent},
                            rng=rng_state())
        now = time.monotonic()
        if now - last_status >= args.status_every:
            last_status = now
            status(f"bc step {learner.steps} epoch {epoch} loss {loss:.5f} "
                   f"{samples * world / max(now - started, 1e-9):.0f} samples/s")
    digests = param_digests(learner.model)
    summary = {"steps": learner.steps, "loss": loss, "param_sha256": digests, "parent_version": parent,
               "skipped": dataset.skipped,  # unusable transitions left out (trainer.sources)
               "samples_per_s": samples * world / max(time.monotonic() - started, 1e-9)}
    if args.out and rank == 0:
        write_weights(args.out, policy.state_dict())
    if client is not None:
        version = -1
        if rank == 0:
            probe = np.stack([_obs(t, obs_spec.name) for t in dataset.transitions[:16]])
            reply = client.publish(policy_name, policy.state_dict(), lineage=policies_pb2.Lineage(
                parent_version=parent, trainer_step=learner.steps,
                data_offset=dataset.transitions[-1].offset + 1,
                reward_version=dataset.transitions[-1].reward_version, trainer=trainer_id("bc"), algo="bc"),
                probe_inputs={obs_spec.name: probe}, probe_outputs=probe_outputs(policy, probe), atol=1e-4)
            version = reply.version
            status(f"bc published {policy_name} v{version} ({reply.load_seconds:.2f} s)")
        summary["published_version"] = dist.broadcast_int(version)
        client.close()
    return summary


def _obs(t, name: str) -> np.ndarray:
    from protos import codec

    return next(codec.decode(x) for x in t.observation if x.name == name).reshape(-1).astype(np.float32)
