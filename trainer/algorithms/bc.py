"""BC's part of the loop (trainer.loop): batches of a log (trainer.sources.LogDataset: --experience-dir, or --demos, a
log or a LeRobotDataset v3.0 folder) -> BCLearner steps (DDP over the ranks); with --gateway it starts from the served
weights and publishes one version at the end.

Step s reads batch (s mod batches_per_epoch) of epoch (s div batches_per_epoch): the data position is a function
of the step, so a resumed run reads exactly what the lost run would have. It reads no stream.

`--arch camera`: a camera policy (trainer.camera_policy: the state and every camera image in, a chunk of H actions
out) fitted to chunked targets (trainer.bc.chunk_targets: the next H applied actions of each logged step's episode).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from bridge.client import ServedPolicy
from protos import codec
from protos.codec import Spec
from trainer import dist
from trainer.bc import BCConfig, BCLearner, chunk_targets, inputs
from trainer.camera_policy import chunk_spec
from trainer.loop import Algorithm, Schedule, observations, served_module
from trainer.policy import GaussianPolicy
from trainer.publisher import Publication, Versions
from trainer.sources import LogDataset
from trainer.weights import build_policy

__all__ = ["BC"]

PROBE = 16


class BC(Algorithm):
    name = "bc"

    def __init__(self, args: argparse.Namespace, served: ServedPolicy | None, versions: Versions):
        rank, world = dist.world()
        self.args = args
        self.dataset = LogDataset(args.experience_dir or args.demos[0], rank=rank, world_size=world, seed=args.seed,
                                  policy=args.data_policy)  # a log or a LeRobotDataset folder (--demos)
        self.obs_names: tuple[str, ...] | None = None  # a camera policy's inputs (its probe is one batch per input)
        chunks = None
        if args.arch == "camera":
            if served is not None:
                policy = served_module(args.arch, served, seed=args.seed)
                inputs, outputs = served.inputs, served.outputs
            else:
                inputs, outputs = _camera_specs_from_log(self.dataset, horizon=args.horizon)
                policy = build_policy("camera", inputs, outputs, seed=args.seed)
            obs_spec, act_spec = inputs[0], outputs[0]
            self.obs_names = tuple(s.name for s in inputs)
            if len(act_spec.shape) == 2:
                chunks = chunk_targets(self.dataset.transitions, horizon=act_spec.shape[0], action=act_spec.name)
        elif served is not None:
            policy = served_module(args.arch, served, seed=args.seed)
            obs_spec, act_spec = served.inputs[0], served.outputs[0]
        else:
            obs_spec, act_spec = _specs_from_log(self.dataset)
            outputs = (act_spec,) if args.arch == "mlp" else GaussianPolicy.output_specs(act_spec)
            policy = build_policy(args.arch, (obs_spec,), outputs, hidden=args.hidden, seed=args.seed)
        self.obs_name = obs_spec.name
        self.learner = BCLearner(policy, config=BCConfig(lr=args.lr, bf16=args.bf16),
                                 observation=self.obs_names or obs_spec.name, action=act_spec.name, chunks=chunks)
        self.batch = args.batch or 256
        self.per_epoch = math.ceil(self.dataset.per_rank() / self.batch)
        if self.per_epoch == 0:
            raise ValueError(f"{len(self.dataset)} transitions cannot feed {world} ranks")
        self.schedule = Schedule(checkpoint_every=args.checkpoint_every or 50, publish_at_end=served is not None)
        self.epoch, self.loss, self.samples = 0, float("nan"), 0

    def state(self) -> dict:
        return {"epoch": self.epoch}

    def start_line(self) -> str:
        d = self.dataset
        return (f"bc: {len(d)} transitions in {len(d.segments)} segment(s) ({d.skipped} unusable skipped), "
                f"{d.per_rank()} per rank, batch {self.batch}, {self.per_epoch} steps/epoch, "
                f"from step {self.learner.steps}")

    def update(self) -> None:
        self.epoch, index = divmod(self.learner.steps, self.per_epoch)
        chunk = next(self.dataset.batches(self.batch, epoch=self.epoch, start=index * self.batch))
        self.loss = self.learner.update(chunk)["loss"]
        self.samples += len(chunk)
        if self.args.step_sleep:
            time.sleep(self.args.step_sleep)  # tests: a run paced per step

    def publication(self) -> Publication:
        last = self.dataset.transitions[-1]
        return Publication(progress=self.learner.steps, trainer_step=self.learner.steps, data_offset=last.offset + 1,
                           reward_version=last.reward_version,
                           probe=self._probe(self.dataset.transitions[:PROBE]), atol=1e-4)

    def _probe(self, transitions) -> np.ndarray | dict[str, np.ndarray]:
        if self.obs_names is None:
            return observations(transitions, self.obs_name)
        return dict(zip(self.obs_names, inputs(transitions, self.obs_names), strict=True))

    def report(self, elapsed: float) -> tuple[str, None]:
        return (f"bc step {self.learner.steps} epoch {self.epoch} loss {self.loss:.5f} "
                f"{self._rate(elapsed):.0f} samples/s"), None

    def summary(self, elapsed: float) -> dict:
        return {"loss": self.loss, "skipped": self.dataset.skipped,  # unusable transitions left out (sources)
                "samples_per_s": self._rate(elapsed)}

    def _rate(self, elapsed: float) -> float:
        return self.samples * dist.world()[1] / max(elapsed, 1e-9)


def _specs_from_log(dataset: LogDataset) -> tuple[Spec, Spec]:
    t = dataset.transitions[0]
    named = [x for x in t.observation if x.name == "observation"]  # the state, beside cameras (a LeRobotDataset's)
    if (len(t.observation) != 1 and len(named) != 1) or not (t.applied_action or t.action):
        raise ValueError(f"offline BC needs one observation tensor (or one named 'observation') and an action per "
                         f"transition; offset {t.offset} has {[x.name for x in t.observation]} -> "
                         f"{[x.name for x in t.action]}")
    obs = named[0] if len(t.observation) != 1 else t.observation[0]
    act = (t.applied_action or t.action)[0]
    return (Spec(obs.name, np.float32, (int(np.prod(obs.shape)),)),
            Spec(act.name, np.float32, (int(np.prod(act.shape)),)))


def _camera_specs_from_log(dataset: LogDataset, *, horizon: int) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    """(inputs, outputs) of a camera policy for the log: its float state vector first, then each uint8 (H, W, 3)
    image in the log's order; a chunk of `horizon` actions (unbounded: the log carries no bounds)."""
    t = dataset.transitions[0]
    arrays = {x.name: codec.decode(x) for x in t.observation}
    states = [Spec(n, np.float32, a.shape) for n, a in arrays.items() if a.dtype.kind == "f" and a.ndim == 1]
    cameras = [Spec(n, np.uint8, a.shape) for n, a in arrays.items() if a.dtype == np.uint8 and a.ndim == 3]
    act = (t.applied_action or t.action)
    if len(states) != 1 or not cameras or len(act) != 1:
        raise ValueError(f"--arch camera needs one float state vector, camera images and one action per transition; "
                         f"offset {t.offset} has {[f'{n}:{a.dtype.name}{list(a.shape)}' for n, a in arrays.items()]} "
                         f"-> {[x.name for x in act]}")
    action = Spec(act[0].name, np.float32, (int(np.prod(act[0].shape)),))
    return (states[0], *cameras), (chunk_spec(action, horizon),)
