"""Rank 0's publishes, in a background thread: the gateway writes, loads and verifies a version
(seconds, under load) while the ranks keep training. At most one publish is in flight.

    publisher = BackgroundPublisher(client, "pendulum")
    ...after an update, on rank 0:
    code = publisher.result()             # 0 nothing new, > 0 the published version, -1 retry, -2 refused
    if publisher.idle:
        publisher.submit(policy.state_dict(), lineage=..., probe_inputs=..., probe_outputs=...)
    publisher.close()
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import numpy as np
import torch

from bridge.client import PoliciesClient
from bridge.client.weights import safetensors_parts
from protos import policies_pb2

__all__ = ["FATAL", "RETRY", "BackgroundPublisher", "served_version_of"]

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
