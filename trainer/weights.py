"""Weights in and out of the trainer: `tether.v1.Policies` List/Fetch/Publish as safetensors.

The trainer starts from the served weights (its lineage parent) and publishes new versions of
the same architecture. The call loop (needs a gateway):

    client = PolicyClient("127.0.0.1:50051")
    served = client.fetch("pendulum")                     # newest version: specs + state_dict
    policy = build_policy("gaussian", served.inputs, served.outputs)
    policy.load_state_dict(served.state_dict, strict=True)
    ...
    reply = client.publish("pendulum", policy.state_dict(), lineage=..., probe_inputs={...},
                           probe_outputs={...})
    reply.version                                         # the new served version

Transport only: how weights are applied (strict load, which outputs are probed) is the caller's.
A version travels in 1 MiB chunks cut straight from the tensors' memory (`safetensors_parts`), or from a
safetensors file on disk (`publish_file`): a 1 GB policy is never copied whole to be sent.

    >>> import torch
    >>> blob = to_safetensors({"w": torch.ones(2)})
    >>> from_safetensors(blob)["w"].tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from protos import codec, policies_pb2, policies_pb2_grpc
from protos.codec import Spec
from trainer.channel import gateway_channel
from trainer.policy import GaussianPolicy, MLPPolicy

__all__ = ["ARCHS", "PolicyClient", "ServedPolicy", "WeightsError", "build_policy", "from_safetensors",
           "hidden_sizes", "safetensors_parts", "to_safetensors"]

ARCHS = ("gaussian", "mlp")
CHUNK_BYTES = 1 << 20


class WeightsError(ValueError):
    """Fetched weights that do not match their header (size, sha256) or are not safetensors."""


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


_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}


def safetensors_parts(state_dict: Mapping[str, torch.Tensor]) -> list[bytes | memoryview]:
    """The safetensors file of `state_dict` as pieces: its header, then each tensor's own memory (CPU tensors are
    not copied). Tensors in the order safetensors writes them (wider dtypes first, then by name).

    >>> parts = safetensors_parts({"w": torch.ones(2), "n": torch.zeros(1, dtype=torch.int64)})
    >>> from_safetensors(b"".join(parts))["w"].tolist(), sum(len(p) for p in parts) % 8
    ([1.0, 1.0], 0)
    """
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    header, offset = {}, 0
    for name in sorted(tensors, key=lambda k: (-tensors[k].element_size(), k)):
        t = tensors[name]
        if t.dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} has no safetensors name")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [struct.pack("<Q", len(text)) + text,
            *(memoryview(tensors[name].reshape(-1).view(torch.uint8).numpy()) for name in header)]


def to_safetensors(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    return b"".join(safetensors_parts(state_dict))


def from_safetensors(blob: bytes) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        return load(blob)
    except Exception as e:  # safetensors raises its own SafetensorError for malformed headers
        raise WeightsError(f"not a safetensors blob ({len(blob)} bytes): {e}") from e


def build_policy(arch: str, inputs: Sequence[Spec], outputs: Sequence[Spec], *,
                 hidden: tuple[int, ...] = (64, 64), seed: int | None = None) -> torch.nn.Module:
    """The architecture `arch` ("gaussian" | "mlp") for a policy served with these specs."""
    if arch not in ARCHS:
        raise ValueError(f"arch {arch!r} must be one of {ARCHS}")
    if len(inputs) != 1:
        raise ValueError(f"the trainer's policies take one observation tensor, the served policy takes "
                         f"{[s.name for s in inputs]}")
    if not outputs:
        raise ValueError("the served policy declares no outputs")
    if arch == "gaussian":
        names = [s.name for s in outputs]
        expected = [s.name for s in GaussianPolicy.output_specs(outputs[0])]
        if names != expected:
            raise ValueError(f"--arch gaussian needs outputs {expected}, the served policy has {names}")
        return GaussianPolicy(inputs[0], outputs[0], hidden=hidden, seed=seed)
    if len(outputs) != 1:
        raise ValueError(f"--arch mlp has one output, the served policy has {[s.name for s in outputs]}")
    return MLPPolicy(inputs[0], outputs[0], hidden=hidden, seed=seed)


def hidden_sizes(state_dict: Mapping[str, torch.Tensor]) -> tuple[int, ...]:
    """The hidden layer sizes of a GaussianPolicy/MLPPolicy state_dict (`net.{i}.weight` rows)."""
    layers = sorted((int(k.split(".")[1]), v) for k, v in state_dict.items()
                    if k.startswith("net.") and k.endswith(".weight") and k.split(".")[1].isdigit())
    if not layers:
        raise WeightsError(f"no net.<i>.weight tensors among {sorted(state_dict)[:8]}: not an MLP policy")
    return tuple(int(w.shape[0]) for _, w in layers[:-1])


class PolicyClient:
    """A `tether.v1.Policies` client (List, Fetch, Publish) with a per-call deadline."""

    def __init__(self, address: str, *, timeout_s: float = 60.0):
        if not address or ":" not in address:
            raise ValueError(f"gateway address {address!r} must be HOST:PORT")
        self.address, self.timeout_s = address, timeout_s
        self._channel = gateway_channel(address, options=[("grpc.max_receive_message_length", 64 << 20),
                                                                ("grpc.max_send_message_length", 64 << 20)])
        self._stub = policies_pb2_grpc.PoliciesStub(self._channel)

    def list(self, policy: str = "") -> policies_pb2.PolicyList:
        return self._stub.List(policies_pb2.ListRequest(policy=policy), timeout=self.timeout_s,
                               wait_for_ready=True)

    def fetch(self, policy: str = "", version: int = 0) -> ServedPolicy:
        """The weights of `version` (0 = newest), checked against the header's size and sha256."""
        listing = self.list(policy)
        header: policies_pb2.PublishHeader | None = None
        data = bytearray()
        for chunk in self._stub.Fetch(policies_pb2.FetchRequest(policy=policy, version=version),
                                      timeout=self.timeout_s, wait_for_ready=True):
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

    def _publish(self, policy: str, parts, *, lineage, probe_inputs, probe_outputs, atol: float,
                 chunk_bytes: int) -> policies_pb2.PublishReply:
        """`parts()`: the version's bytes, in pieces (called twice: the digest, then the stream)."""
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
            for data in _chunked(parts(), chunk_bytes):
                yield policies_pb2.PublishChunk(data=data)

        return self._stub.Publish(chunks(), timeout=self.timeout_s, wait_for_ready=True)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _chunked(parts: Iterable[bytes | memoryview], size: int) -> Iterator[bytes]:
    """`parts` re-cut into pieces of `size` bytes (the last shorter): one piece in memory at a time."""
    pending = bytearray()
    for part in parts:
        view = memoryview(part).cast("B")
        while view:
            take = size - len(pending)
            pending += view[:take]
            view = view[take:]
            if len(pending) == size:
                yield bytes(pending)
                pending.clear()
    if pending:
        yield bytes(pending)
