"""The client of `tether.v1.Policies`: versions in and out (List, Fetch, Publish) and their rollout.

    with PoliciesClient("127.0.0.1:50051", Credentials.from_env()) as client:
        served = client.fetch("pendulum")                 # newest version: specs + state_dict (safetensors)
        policy.load_state_dict(served.state_dict, strict=True)
        reply = client.publish("pendulum", policy.state_dict(), lineage=..., probe_inputs={...},
                               probe_outputs={...})
        reply.version                                     # the new served version
        client.promote("pendulum", reply.version, to="canary", reason="looks good", fraction=0.1)

Transport only: how weights are applied (strict load, which outputs are probed) is the caller's. A version
travels in 1 MiB chunks cut straight from the tensors' memory (`bridge.client.weights.safetensors_parts`),
or from a safetensors file on disk (`publish_file`): a 1 GB policy is never copied whole to be sent. A
whole policy file (TorchScript, ONNX) goes as a ready Publish stream (`publish_stream`,
`tether.policy_cli.publish_chunks`). With `aio=True` the one-call methods (`list`, `publish_stream`, the
rollout calls) return awaitables; `fetch`, `publish` and `publish_file` are blocking only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.client.channel import ServiceClient
from bridge.client.weights import WeightsError, chunked, from_safetensors, safetensors_parts
from protos import codec, policies_pb2, policies_pb2_grpc
from protos.codec import Spec

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = ["CHUNK_BYTES", "PoliciesClient", "ServedPolicy"]

CHUNK_BYTES = 1 << 20
MESSAGE_BYTES = 64 << 20


@dataclass(frozen=True)
class ServedPolicy:
    """One served version: its specs (no batch dimension), weights and lineage."""

    policy: str
    version: int
    inputs: tuple[Spec, ...]
    outputs: tuple[Spec, ...]
    state_dict: dict[str, torch.Tensor]
    sha256: str
    lineage: policies_pb2.Lineage
    published_unix_ns: int


class PoliciesClient(ServiceClient):
    """`tether.v1.Policies` at `address` with a per-call deadline (`timeout_s`, default 60 s). The version calls
    (List, Fetch, Publish) wait for the gateway to be ready; the rollout calls fail at once without one."""

    STUB = policies_pb2_grpc.PoliciesStub
    OPTIONS = (("grpc.max_receive_message_length", MESSAGE_BYTES), ("grpc.max_send_message_length", MESSAGE_BYTES))

    # -- versions ----------------------------------------------------------------------------------------------

    def list(self, policy: str = "") -> policies_pb2.PolicyList:
        return self._call("List", policies_pb2.ListRequest(policy=policy), wait_for_ready=True)

    def fetch(self, policy: str = "", version: int = 0) -> ServedPolicy:
        """The weights of `version` (0 = newest), checked against the header's size and sha256."""
        self._blocking("fetch")
        listing = self.list(policy)
        header: policies_pb2.PublishHeader | None = None
        data = bytearray()
        for chunk in self._call("Fetch", policies_pb2.FetchRequest(policy=policy, version=version),
                                wait_for_ready=True):
            if chunk.HasField("header"):
                header = chunk.header
            else:
                data += chunk.data
        if header is None:
            raise WeightsError(f"Policies.Fetch({policy!r}, {version}) sent no header")
        if header.format != "safetensors":
            raise WeightsError(f"Policies.Fetch sent format {header.format!r}, expected 'safetensors'")
        if len(data) != header.size:
            raise WeightsError(f"Policies.Fetch sent {len(data)} bytes, header says {header.size}")
        digest = hashlib.sha256(data).hexdigest()
        if header.sha256 and digest != header.sha256:
            raise WeightsError(f"Policies.Fetch: sha256 {digest} does not match the header's {header.sha256}")
        fetched = version or listing.newest
        entry = next((v for v in listing.versions if v.version == fetched), None)
        return ServedPolicy(policy=header.policy or listing.policy, version=fetched,
                            inputs=codec.specs_from_proto(listing.inputs),
                            outputs=codec.specs_from_proto(listing.outputs),
                            state_dict=from_safetensors(bytes(data)), sha256=digest, lineage=header.lineage,
                            published_unix_ns=entry.published_unix_ns if entry else 0)

    def publish(self, policy: str, state_dict: Mapping[str, torch.Tensor], *, lineage: policies_pb2.Lineage,
                probe_inputs: Mapping[str, np.ndarray], probe_outputs: Mapping[str, np.ndarray],
                atol: float = 0.0, chunk_bytes: int = CHUNK_BYTES) -> policies_pb2.PublishReply:
        """Send `state_dict` as a new version of `policy`; the reply carries the version number."""
        import torch

        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        for name, t in state_dict.items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ValueError(f"{name}: refusing to publish NaN or infinite weights")
        parts = safetensors_parts(state_dict)  # views of the tensors: nothing joined
        return self._publish(policy, lambda: parts, lineage=lineage, probe_inputs=probe_inputs,
                             probe_outputs=probe_outputs, atol=atol, chunk_bytes=chunk_bytes)

    def publish_file(self, policy: str, path: Path | str, *, lineage: policies_pb2.Lineage,
                     probe_inputs: Mapping[str, np.ndarray], probe_outputs: Mapping[str, np.ndarray],
                     atol: float = 0.0, chunk_bytes: int = CHUNK_BYTES) -> policies_pb2.PublishReply:
        """Send a safetensors file as a new version of `policy`, read from disk twice in chunks (its digest,
        then the stream): a version larger than memory is never held here."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no safetensors file at {path}")

        def parts() -> Iterator[bytes]:
            with path.open("rb") as f:
                while block := f.read(chunk_bytes):
                    yield block

        return self._publish(policy, parts, lineage=lineage, probe_inputs=probe_inputs, probe_outputs=probe_outputs,
                             atol=atol, chunk_bytes=chunk_bytes)

    def publish_stream(self, chunks: Iterable[policies_pb2.PublishChunk]) -> policies_pb2.PublishReply:
        """One Publish call with a ready stream: a header chunk, then the data chunks."""
        return self._call("Publish", iter(chunks), wait_for_ready=True)

    def _publish(self, policy: str, parts, *, lineage, probe_inputs, probe_outputs, atol: float,
                 chunk_bytes: int) -> policies_pb2.PublishReply:
        """`parts()`: the version's bytes, in pieces (called twice: the digest, then the stream)."""
        self._blocking("publish")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        digest, size = hashlib.sha256(), 0
        for part in parts():
            digest.update(part)
            size += len(part)
        header = policies_pb2.PublishHeader(
            policy=policy, format="safetensors", size=size, sha256=digest.hexdigest(), lineage=lineage,
            probe_inputs=codec.encode_all(probe_inputs), probe_outputs=codec.encode_all(probe_outputs), atol=atol)

        def chunks() -> Iterator[policies_pb2.PublishChunk]:
            yield policies_pb2.PublishChunk(header=header)
            for data in chunked(parts(), chunk_bytes):
                yield policies_pb2.PublishChunk(data=data)

        return self.publish_stream(chunks())

    def _blocking(self, what: str) -> None:
        if self.aio:
            raise TypeError(f"PoliciesClient.{what} is blocking: build the client without aio=True")

    # -- rollout -----------------------------------------------------------------------------------------------

    def rollout_status(self, policy: str = "", *, events: int = 10) -> policies_pb2.RolloutStatusReply:
        """Versions, states, gate checks, runtime figures, pins and the last `events` audit events."""
        return self._call("RolloutStatus", policies_pb2.RolloutStatusRequest(policy=policy, events=events))

    def promote(self, policy: str, version: int, *, to: str, reason: str = "", fraction: float | None = None,
                labels: Mapping[str, str] | None = None) -> policies_pb2.RolloutStatusReply:
        """Move `version` to "shadow", "canary" (of `fraction` of the sessions, or those with `labels`) or "live"."""
        request = policies_pb2.PromoteRequest(policy=policy, version=version, to=to, why=reason,
                                              canary_labels=labels or {})
        if fraction is not None:
            request.canary_fraction = fraction
        return self._call("Promote", request)

    def rollback(self, policy: str, version: int = 0, *, reason: str = "") -> policies_pb2.RolloutStatusReply:
        """Roll back `version` (0: the live one; the previous live comes back)."""
        return self._call("Rollback", policies_pb2.RollbackRequest(policy=policy, version=version, why=reason))

    def pin(self, policy: str, selector: str, version: int, *, reason: str = "") -> policies_pb2.RolloutStatusReply:
        """Hold the sessions of `selector` (session=ID or KEY=VALUE) on `version` (0: unpin)."""
        return self._call("Pin", policies_pb2.PinRequest(policy=policy, selector=selector, version=version,
                                                         why=reason))

    def set_canary(self, policy: str, *, fraction: float | None = None, labels: Mapping[str, str] | None = None,
                   clear_labels: bool = False, reason: str = "") -> policies_pb2.RolloutStatusReply:
        """Which sessions get the canary: a fraction of them, or those with `labels` (`clear_labels`: back to the
        fraction)."""
        request = policies_pb2.CanaryRequest(policy=policy, labels=labels or {}, clear_labels=clear_labels,
                                             why=reason)
        if fraction is not None:
            request.fraction = fraction
        return self._call("SetCanary", request)
