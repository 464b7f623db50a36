"""Rank 0's publishes, in a background thread: the gateway writes, loads and verifies a version
(seconds, under load) while the ranks keep training. At most one publish is in flight.

    publisher = BackgroundPublisher(client, "pendulum")
    ...after an update, on rank 0:
    code = publisher.result()             # 0 nothing new, > 0 the published version, -1 retry, -2 refused
    if publisher.idle:
        publisher.submit(policy.state_dict(), lineage=..., probe_inputs=..., probe_outputs=...)
    publisher.close()

The training loop (trainer.loop) puts a `PublishQueue` in front of it on rank 0 (the newest queued version waits
for the publisher to be free; a retryable failure goes again a second later) and keeps the `Versions` every rank
learns from the outcomes (`versions.learn(*queue.outcome())`, all-reduced).
"""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import numpy as np
import torch

from bridge.client import PoliciesClient, ServedPolicy
from bridge.client.weights import safetensors_parts
from protos import policies_pb2
from trainer import dist
from trainer.policy import probe_outputs

__all__ = ["FATAL", "RETRY", "BackgroundPublisher", "PublishQueue", "Publication", "Versions", "served_version_of"]

RETRY, FATAL = -1, -2
# RESOURCE_EXHAUSTED: the gateway's publish caps; ABORTED: the version the gate judged against was rolled back
# meanwhile (bridge.gateway.versions.publisher.GateSuperseded): publishing again is judged against the live one
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
              grpc.StatusCode.ABORTED)


def _say(line: str) -> None:
    print(f"[trainer] {line}", file=sys.stderr, flush=True)


class BackgroundPublisher:
    def __init__(self, client: PoliciesClient, policy: str):
        self.client, self.policy = client, policy
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="publish")
        self._future: Future[int] | None = None

    @property
    def busy(self) -> bool:
        return self._future is not None and not self._future.done()

    @property
    def idle(self) -> bool:
        """Nothing in flight and the last outcome taken by `result`: a `submit` loses nothing."""
        return self._future is None

    def submit(self, state_dict: Mapping[str, torch.Tensor], *, lineage: policies_pb2.Lineage,
               probe_inputs: Mapping[str, np.ndarray], probe_outputs: Mapping[str, np.ndarray],
               atol: float = 0.0) -> None:
        """Publish a snapshot of `state_dict` (copied now: training may go on). `atol` 0: the gate's
        consistency tolerance for the version's serving format (bridge.gate.checks.SERVING_TOLERANCES)."""
        if not self.idle:
            raise RuntimeError("a publish is in flight, or its outcome was not taken with result()")
        snapshot = {k: v.detach().to("cpu", copy=True) for k, v in state_dict.items()}
        self._future = self._pool.submit(self._publish, snapshot, lineage, dict(probe_inputs), dict(probe_outputs),
                                         atol)

    def result(self, *, wait: bool = False) -> int:
        """The finished publish's outcome (once): version > 0, RETRY or FATAL; 0 when none finished."""
        if self._future is None or (not wait and not self._future.done()):
            return 0
        future, self._future = self._future, None
        return future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _publish(self, state, lineage, probe_inputs, probe_outputs, atol) -> int:
        try:
            reply = self.client.publish(self.policy, state, lineage=lineage, probe_inputs=probe_inputs,
                                        probe_outputs=probe_outputs, atol=atol)
        except grpc.RpcError as e:
            if e.code() in _RETRYABLE:
                _say(f"publish {self.policy}: {e.code().name} ({e.details()}), retrying after the next update")
                return RETRY
            _say(f"publish {self.policy} refused: {e.code().name}: {e.details()}")
            return FATAL
        except Exception as e:  # a bug on this side: the run must stop, not go on unpublished
            _say(f"publish {self.policy} failed: {type(e).__name__}: {e}")
            return FATAL
        _say(f"published {self.policy} v{reply.version} (parent v{lineage.parent_version}, step "
             f"{lineage.trainer_step}, {reply.load_seconds:.2f} s, max error {reply.max_abs_error:.2e})")
        return reply.version


def served_version_of(listing: policies_pb2.PolicyList, state_dict: Mapping[str, torch.Tensor]
                      ) -> policies_pb2.PolicyVersion | None:
    """The served version whose weights are exactly `state_dict` (same safetensors sha256), if any:
    after a restart, the checkpoint's weights may already have been published."""
    digest = hashlib.sha256()
    for part in safetensors_parts(state_dict):  # the bytes `PoliciesClient.publish` sends, never joined
        digest.update(part)
    digest = digest.hexdigest()
    return next((v for v in listing.versions if v.sha256 == digest), None)


@dataclass(frozen=True)
class Publication:
    """A version to publish, besides its weights: its lineage and the probe batch the gateway checks it on."""

    progress: int
    trainer_step: int
    data_offset: int
    reward_version: str
    probe: np.ndarray | dict[str, np.ndarray]  # one input's batch, or {input name: batch} (a camera policy)
    atol: float = 0.0                  # 0: the gate's tolerance for the serving format


@dataclass
class Versions:
    """The trained policy's versions, the same on every rank: `version` is the newest (the next publish's parent
    and what lag is measured against), `parent` the one the run started from, `served_progress` the algorithm's
    progress that the newest version it published holds."""

    policy: str
    version: int = 0
    parent: int = 0
    publish_ns: int = 0
    published: list[int] = field(default_factory=list)
    served_progress: int = 0

    @classmethod
    def of(cls, served: ServedPolicy | None, policy: str) -> Versions:
        if served is None:
            return cls(policy)
        return cls(served.policy, served.version, served.version, served.published_unix_ns or time.time_ns())

    def meta(self) -> dict:
        return {"version": self.version, "parent": self.parent, "publish_ns": self.publish_ns,
                "published": self.published}

    def restore(self, meta: dict) -> None:
        self.version, self.parent = meta.get("version", self.version), meta.get("parent", self.parent)
        self.publish_ns, self.published = meta.get("publish_ns", self.publish_ns), list(meta.get("published", []))

    def catch_up(self, listing: policies_pb2.PolicyList, weights: dict[str, torch.Tensor]) -> None:
        """After a restart: a publish that finished after the checkpoint holds these weights, or the chain goes
        on from the newest version anyway."""
        match = served_version_of(listing, weights)
        if match is not None and match.version > self.version:
            self.version, self.publish_ns = match.version, match.published_unix_ns or self.publish_ns
            self.published.append(match.version)
        self.version = max(self.version, listing.newest)

    def learn(self, code: int, progress: int) -> None:
        """Rank 0's publish outcome `code` (the same on every rank: a collective when it is a version)."""
        if code == FATAL:
            raise RuntimeError("publishing failed (see rank 0's log)")
        if code > 0:
            self.published.append(code)
            self.version, self.publish_ns, self.served_progress = code, dist.broadcast_int(time.time_ns()), progress


class PublishQueue:
    """Rank 0's publishes: the newest queued version waits for the background publisher to be free."""

    def __init__(self, client: PoliciesClient, versions: Versions, algo: str, input_name: str):
        self.publisher = BackgroundPublisher(client, versions.policy)
        self.versions, self.algo, self.input_name = versions, algo, input_name
        self.queued: _Queued | None = None
        self.submitted: _Queued | None = None
        self.retry_at = 0.0

    def queue(self, publication: Publication, policy: torch.nn.Module) -> None:
        """A snapshot of `policy`'s weights and its outputs on the probe, to publish when the publisher is free."""
        weights = {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}
        self.queued = _Queued(publication, weights, probe_outputs(policy, publication.probe))

    def outcome(self, *, wait: bool = False) -> tuple[int, int]:
        """(the finished publish's code, the progress its version holds); (0, 0) when none finished."""
        code = self.publisher.result(wait=wait)
        if code == RETRY and self.submitted is not None:
            self.queued = self.queued or self.submitted  # nothing newer: publish the same weights again
            self.retry_at = time.monotonic() + 1.0
        return code, self.submitted.publication.progress if code > 0 and self.submitted is not None else 0

    def submit(self) -> None:
        if self.queued is None or not self.publisher.idle or time.monotonic() < self.retry_at:
            return
        self.submitted, self.queued = self.queued, None
        p = self.submitted.publication
        self.publisher.submit(self.submitted.weights, lineage=policies_pb2.Lineage(
            parent_version=self.versions.version, trainer_step=p.trainer_step, data_offset=p.data_offset,
            reward_version=p.reward_version, trainer=f"{self.algo}@{socket.gethostname()}:{os.getpid()}",
            algo=self.algo), probe_inputs=p.probe if isinstance(p.probe, dict) else {self.input_name: p.probe},
            probe_outputs=self.submitted.outputs,
            atol=p.atol)

    def close(self) -> None:
        self.publisher.close()


@dataclass(frozen=True)
class _Queued:
    publication: Publication
    weights: dict[str, torch.Tensor]
    outputs: dict[str, np.ndarray]
