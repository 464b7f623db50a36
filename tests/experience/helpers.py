"""Shared pieces of the experience-log tests: transitions, an independent MCAP check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from mcap.reader import make_reader

from protos import bridge_pb2, codec, experience_pb2


def transition(session: str, step: int, *, episode: int = 0, obs_dim: int = 11, reward: float = 1.0,
               image: tuple[int, ...] | None = None, policy: str = "pi", version: int = 1,
               last: bool = False) -> experience_pb2.Transition:
    rng = np.random.default_rng(step)
    obs = [codec.encode("observation", rng.standard_normal(obs_dim).astype(np.float32))]
    if image is not None:
        obs.append(codec.encode("image", rng.integers(0, 256, image, dtype=np.uint8)))
    return experience_pb2.Transition(
        session=session, episode=episode, step=step,
        step_type=bridge_pb2.FIRST if step == 0 else bridge_pb2.MID, observation=obs,
        action=[codec.encode("action", np.full(3, step % 7, dtype=np.float32))],
        reward=reward, reward_terms={"alive": reward}, terminated=last, policy=policy, policy_version=version,
        reward_version="r1", timing=bridge_pb2.Timing(t_sent_ns=1_000 + step, gateway_recv_ns=2_000 + step),
        source="test")


def mcap_transitions(path: Path) -> list:
    """Decodes a segment with the mcap reader and a message class built only from the file's own schema
    (as a tool without Tether would), checking the summary's message count against what is there."""
    with open(path, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        assert summary is not None, f"{path}: no summary"
        schema = next(iter(summary.schemas.values()))
        assert schema.name == "tether.v1.Transition" and schema.encoding == "protobuf"
        fds = descriptor_pb2.FileDescriptorSet.FromString(schema.data)
        pool = descriptor_pool.DescriptorPool()
        for fd in fds.file:
            pool.Add(fd)
        cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(schema.name))
        out = [cls.FromString(m.data) for _, _, m in reader.iter_messages()]
        assert summary.statistics.message_count == len(out), f"{path}: statistics disagree with the messages"
    return out
