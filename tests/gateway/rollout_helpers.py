"""Shared pieces of the rollout tests (each adds a policy of its own to the session's Triton: `triton.add_policy`):
publishing a version, and a small fleet of raw sessions whose env reward depends on the action they got."""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
import safetensors.torch
import torch

from bridge.registry import assign
from protos import bridge_pb2, policies_pb2
from protos.codec import decode, encode
from tests.conftest import ACT, OBS
from tests.gateway.helpers import RawSession, hello
from trainer.policy import MLPPolicy


def variant(module: MLPPolicy, *, scale: float = 1.0, flip: bool = False) -> dict[str, torch.Tensor]:
    """The module's weights, the hidden layers scaled; `flip`: the last layer negated (actions flip sign)."""
    state = {k: v.detach().clone() for k, v in module.state_dict().items()}
    last = max(k for k in state if k.startswith("net.") and k.endswith(".weight"))
    for k in state:
        if k.startswith("net."):
            state[k] = state[k] * scale
            if flip and k.startswith(last.rsplit(".", 1)[0] + "."):
                state[k] = -state[k]
    return {k: v.contiguous() for k, v in state.items()}


async def publish(stub, policy: str, weights: dict[str, torch.Tensor], *, chunk: int = 1 << 16, metadata=None):
    module = MLPPolicy(OBS[0], ACT[0])
    module.load_state_dict(weights, strict=False)
    probe = np.random.default_rng(0).standard_normal((4, 11)).astype(np.float32)
    with torch.no_grad():
        reference = module.eval()(torch.from_numpy(probe)).numpy()
    data = safetensors.torch.save(weights)
    header = policies_pb2.PublishHeader(
        policy=policy, format="safetensors", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
        lineage=policies_pb2.Lineage(parent_version=1, trainer_step=3, trainer="test"),
        probe_inputs=[encode("observation", probe)], probe_outputs=[encode("action", reference)])
    chunks = [policies_pb2.PublishChunk(header=header)]
    chunks += [policies_pb2.PublishChunk(data=data[i:i + chunk]) for i in range(0, len(data), chunk)]
    return await stub.Publish(iter(chunks), metadata=metadata)


class Fleet:
    """N raw sessions, each with a fixed observation; the env reward of a step is the action's
    agreement with `direction` (what v1 does), so a version that flips the action sign earns
    negative returns. Every reply is checked: an action (or an episode end), never an error, and
    labelled with the version the rollout assigns to that session, never by the shadow."""

    def __init__(self, gateway, policy: str, labels: list[dict[str, str]], *, episode_steps: int = 6,
                 clamped_by: int | None = None):
        self.gw, self.policy, self.labels, self.episode_steps = gateway, policy, labels, episode_steps
        self.per_episode = gateway.config.switch == "episode"  # a version holds for the whole episode
        rng = np.random.default_rng(1)
        self.obs = [rng.standard_normal(11).astype(np.float32) for _ in labels]
        self.direction: dict[int, np.ndarray] = {}  # per session: the sign of its first action (v1's)
        self.versions: list[list[int]] = [[] for _ in labels]   # per session, per acted step
        self.errors: list[str] = []
        self.sessions: list[RawSession] = []
        self.clamped_by, self.clamped = clamped_by, [0] * len(labels)  # the edge guard clamps this version's actions

    async def __aenter__(self):
        for i, labels in enumerate(self.labels):
            h = hello(f"{self.policy}-s{i}", obs=OBS, act=ACT, policy=self.policy)
            h.labels.update(labels)
            self.sessions.append(await RawSession(self.gw.address, h).__aenter__())
        return self

    async def __aexit__(self, *exc):
        for s in self.sessions:
            await s.__aexit__()

    def expected(self, i: int) -> int | None:
        rollout = self.gw.rollout.rollouts()[self.policy]
        return assign(rollout, f"{self.policy}-s{i}", self.labels[i])

    async def episode(self, i: int) -> None:
        s, obs = self.sessions[i], self.obs[i]
        reward, allowed = 0.0, set()
        for t in range(self.episode_steps + 1):
            step_type = bridge_pb2.FIRST if t == 0 else bridge_pb2.LAST if t == self.episode_steps else bridge_pb2.MID
            before, shadow = self.expected(i), self.gw.rollout.rollouts()[self.policy].shadow
            guard = bridge_pb2.GuardReport(clamped=self.clamped[i])
            reply = await s.send([encode("observation", obs)], step_type=step_type, reward=reward, guard=guard)
            kind = reply.WhichOneof("kind")
            if step_type == bridge_pb2.LAST:
                if kind != "episode_end":
                    self.errors.append(f"session {i}: {reply}")
                return
            if kind != "action":
                self.errors.append(f"session {i} step {t}: {reply}")
                return
            version = reply.action.policy_version
            if t == 0 or not self.per_episode:
                allowed = {before, self.expected(i)}
            if version not in allowed:
                self.errors.append(f"session {i} acted with v{version} at step {t}, the rollout says {allowed}")
            if version == shadow == self.gw.rollout.rollouts()[self.policy].shadow:
                self.errors.append(f"session {i} was answered by the shadow v{version}")
            self.versions[i].append(version)
            self.clamped[i] += version == self.clamped_by
            action = decode(reply.action.tensors[0])
            if i not in self.direction:  # keyed by session: sessions finish their first step in any order
                self.direction[i] = np.sign(action)
            reward = float(np.dot(action, self.direction[i]))

    async def round(self) -> None:
        await asyncio.gather(*(self.episode(i) for i in range(len(self.sessions))))
