"""PPO's collectives line up on every rank even when one rank has no data for an update (one vectorised
session's envs may all hash to the other rank's shard): two real gloo ranks in two processes, rank 1 empty,
--target-kl on (its early stop was once decided on the rank's own sample count, so the empty rank skipped
that collective and the group died with a gloo size mismatch)."""

from __future__ import annotations

import datetime
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bridge.common.processes import free_port
from protos.codec import Spec
from tests.trainer.test_ppo import synthetic_segments
from trainer.policy import GaussianPolicy
from trainer.ppo import PPOConfig, PPOLearner


def _rank(rank: int, port: int, results) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    try:
        spec_o, spec_a = Spec("observation", np.float32, (4,)), Spec("action", np.float32, (1,))
        learner = PPOLearner(GaussianPolicy(spec_o, spec_a, seed=0), seed=0,
                             config=PPOConfig(epochs=4, minibatches=2, target_kl=1e9))
        segments = synthetic_segments([1] * 16).take() if rank == 0 else []
        stats = learner.update(segments, newest_version=1)
        results[rank] = (learner.steps, stats["global_kept"])
    finally:
        dist.destroy_process_group()


def test_an_update_with_one_rank_empty_keeps_the_collectives_in_step():
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_rank, args=(free_port(), results), nprocs=2, join=True, start_method="spawn")
        got = dict(results)
    # both ranks stepped together: 4 epochs x 2 minibatches, over rank 0's 16 samples
    assert got == {0: (8, 16.0), 1: (8, 16.0)}, got
