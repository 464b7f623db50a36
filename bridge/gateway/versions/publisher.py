"""New weights in, a written, loaded and READY policy version out: the mechanics of a publish.
The flow (registry, gate, rollout) is `bridge.gateway.rollout.controller.RolloutController.publish`.

    publisher = Publisher(repository=ModelRepository(root), client=policy_client)
    async with publisher.uploads().receive(header, chunks) as upload:   # streamed to disk (versions.uploads)
        integrity, weights = await publisher.check(header, upload, "pendulum", 3, gate)  # large: built apart
        await publisher.write("pendulum", 4, header, weights, base=3)   # version folder + tether.json
    weights, architecture = publisher.decode(header, data, "pendulum", base=3)   # PublishError if unreadable
    ready = await publisher.load("pendulum", 4)     # load_model; VerificationFailed unless v4 is READY
    await publisher.withdraw("pendulum", 4)         # retired again and unloaded (a refused version)
    header, data = publisher.fetch("pendulum", 4)   # a version's weights, as published
    async with publisher.admission.hold(header.size):  # PublishRefused (RESOURCE_EXHAUSTED) past the caps
        ...                                            # receive the chunks, publish

Large versions: a safetensors upload above `PublishLimits.inline_bytes` is checked (integrity) and its version
folder built by a child process at a lower CPU priority (bridge.gateway.versions.build); `write` renames it
into place. Smaller ones are decoded and written in the gateway's threads (no process to start).

Durability: the version folder (its files, the folder, the model folder) and its tether.json are
fsynced before `write` returns, so no registry state that names the version is committed before the
bytes it names are on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf import json_format

from bridge.common.errors import InvalidArgument, ResourceExhausted
from bridge.common.files import write_text
from bridge.gate.checks import CheckResult
from bridge.gateway.versions.build import BuildFailed, build_apart
from bridge.gateway.versions.uploads import Upload, Uploads
from inference_server import ModelRepository, PolicyClient
from inference_server.artifact import ArtifactError
from inference_server.formats import FORMATS, ImportedFile, imported_file
from protos import policies_pb2
from protos.codec import TensorError, specs_from_proto

log = logging.getLogger("tether.gateway")


class PublishError(InvalidArgument):
    """A publish the gateway refuses: a bad header or stream, weights that do not fit, a version that fails."""


class VerificationFailed(PublishError, status=grpc.StatusCode.FAILED_PRECONDITION):
    """The version loaded but Triton does not serve what the trainer computed (or it is not READY)."""


class GateSuperseded(PublishError, status=grpc.StatusCode.ABORTED):
    """The version the candidate was judged against was withdrawn during its gate: not promoted."""


class PublishRefused(ResourceExhausted):
    """Too many publishes in flight, or too many of their bytes held in memory: try again later."""


@dataclass(frozen=True, kw_only=True)
class PublishLimits:
    """Publishes in flight at once (receiving, waiting for the gate, gated) and the bytes they may hold
    together (each counts the size its header announces, from the header to its reply); versions above
    `inline_bytes` are checked and built by a child process (streamed to disk either way)."""

    max_inflight: int = 4
    max_bytes: int = 4 << 30
    inline_bytes: int = 16 << 20

    def __post_init__(self):
        for name in ("max_inflight", "max_bytes", "inline_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PublishLimits.{name} must be an integer >= 1, got {value!r}")


class PublishAdmission:
    """Counts publishes and their bytes; `hold(size)` refuses past the caps (PublishRefused).

    >>> admission = PublishAdmission(PublishLimits(max_inflight=1, max_bytes=10))
    >>> admission.inflight, admission.bytes_held
    (0, 0)
    """

    def __init__(self, limits: PublishLimits | None = None):
        self.limits = limits or PublishLimits()
        self.inflight = self.bytes_held = self.refused = 0

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        limits = self.limits
        if self.inflight >= limits.max_inflight:
            self.refused += 1
            raise PublishRefused(f"{self.inflight} publishes are in flight, the gateway's cap is "
                                 f"{limits.max_inflight}: try again when one has finished")
        if self.bytes_held + size > limits.max_bytes:
            self.refused += 1
            raise PublishRefused(f"this publish announces {size} bytes; with the {self.bytes_held} bytes that the "
                                 f"{self.inflight} publishes in flight hold, that is more than the gateway's cap of "
                                 f"{limits.max_bytes} bytes: try again when one has finished")
        self.inflight += 1
        self.bytes_held += size
        try:
            yield
        finally:
            self.inflight -= 1
            self.bytes_held -= size


class Publisher:
    def __init__(self, *, repository: ModelRepository | None, client: PolicyClient,
                 limits: PublishLimits | None = None):
        self._repo = repository
        self._client = client
        self.admission = PublishAdmission(limits)
        self._uploads: Uploads | None = None

    def repository(self) -> ModelRepository:
        if self._repo is None:
            raise PublishError("this gateway was started without --model-repository: it cannot publish")
        return self._repo

    def uploads(self) -> Uploads:
        """Where Publish streams go (root/.incoming; what a killed gateway left there is removed at first use)."""
        if self._uploads is None:
            self._uploads = Uploads(self.repository().root / ".incoming")
        return self._uploads

    async def check(self, header: policies_pb2.PublishHeader, upload: Upload, name: str, base: int | None,
                    gate) -> tuple[CheckResult, dict | ImportedFile | Path | None]:
        """The gate's integrity check of an upload and what `write` takes: the weights (decoded here, in a
        thread) or, for a safetensors file above `inline_bytes`, the version folder a child process built."""
        if header.format == "safetensors" and upload.size > self.admission.limits.inline_bytes and base is not None:
            try:
                return await build_apart(root=self.repository().root, model=name, base=base, upload=upload,
                                         sha256=header.sha256)
            except BuildFailed as exc:
                raise PublishError(f"policy {name!r}: {exc}") from exc
        data = await asyncio.to_thread(upload.read)
        weights, architecture = await asyncio.to_thread(self.decode, header, data, name, base)
        integrity = await asyncio.to_thread(gate.check_artifact, weights, architecture, sha256=header.sha256,
                                            digest=upload.sha256)
        return integrity, weights

    def decode(self, header: policies_pb2.PublishHeader, data: bytes, name: str,
               base: int) -> tuple[dict, dict | None]:
        """The published tensors and the architecture they must fit (`base`'s weights; None if unknown).
        The sha256 is the gate's to judge (integrity); unreadable bytes are a PublishError here."""
        weights = _check_bytes(header, data)
        if isinstance(weights, ImportedFile):
            return weights, None  # a whole policy file: its own architecture, nothing to compare with
        try:
            architecture = self.repository().state_dict(name, base)
        except (FileNotFoundError, ValueError):
            architecture = None
        return weights, architecture

    async def write(self, name: str, version: int, header: policies_pb2.PublishHeader, weights: dict,
                    base: int) -> None:
        """The version folder (base's architecture with `weights`) and its tether.json, atomically,
        fsynced (files and folders) before it returns."""
        repo = self.repository()
        try:
            if isinstance(weights, Path):  # built apart (a large version): a rename into place
                await asyncio.to_thread(repo.install, name, version, weights)
            elif isinstance(weights, ImportedFile):  # `tether policy import`: the file as it is, never run here
                await asyncio.to_thread(repo.write_artifact, name, version, weights.format, weights.data,
                                        weights.inputs, weights.outputs)
            else:
                await asyncio.to_thread(repo.write_weights, name, version, weights, base_version=base)
        except ValueError as exc:
            raise PublishError(f"policy {name!r}: {exc}") from exc
        await asyncio.to_thread(_write_metadata, repo, name, version, header)

    async def load(self, name: str, version: int) -> list[int]:
        await self._client.load_model(name)
        ready = await self._client.ready_versions(name)
        if version not in ready:
            raise VerificationFailed(f"policy {name!r} v{version} is not READY in Triton after load_model "
                                     f"(ready: {ready})")
        return ready

    async def withdraw(self, name: str, version: int) -> None:
        """Retire a refused version's folder and have Triton unload it (the others keep serving)."""
        repo = self._repo
        if repo is None or version not in repo.versions(name):
            return
        await asyncio.to_thread(repo.retire, name, version)  # a rename, fsynced: off the loop
        try:
            await self._client.load_model(name)  # unloads it
        except Exception as exc:
            log.error("policy %s: unloading the refused v%d: %s", name, version, exc)

    def fetch(self, name: str, version: int) -> tuple[policies_pb2.PublishHeader, bytes]:
        """The weights of `version` (a version on disk) as safetensors bytes, with their header."""
        repo = self.repository()
        try:
            state = repo.state_dict(name, version)
        except (FileNotFoundError, ValueError) as exc:
            raise PublishError(str(exc)) from exc
        import safetensors.torch  # torch: only a gateway that publishes loads it

        data = safetensors.torch.save(state)
        header = policies_pb2.PublishHeader(policy=name, format="safetensors", size=len(data),
                                            sha256=hashlib.sha256(data).hexdigest())
        meta = read_metadata(repo, name, version)
        if meta is not None:
            header.lineage.CopyFrom(meta.lineage)
        return header, data


def _check_bytes(header: policies_pb2.PublishHeader, data: bytes) -> dict:
    if header.format not in ("safetensors", *FORMATS):
        raise PublishError(f"format {header.format!r}: weights travel as 'safetensors', whole policy files "
                           f"as {' or '.join(map(repr, FORMATS))}")
    if len(data) != header.size:
        raise PublishError(f"received {len(data)} bytes, the header announced {header.size}")
    if header.format in FORMATS:  # `tether policy import`: checked by its format (inference_server.formats)
        try:
            return imported_file(header.format, data, specs_from_proto(header.inputs),
                                 specs_from_proto(header.outputs))
        except (ArtifactError, TensorError) as exc:
            raise PublishError(f"{header.format} file for policy {header.policy!r}: {exc}") from exc
    try:
        import safetensors.torch

        return safetensors.torch.load(data)
    except Exception as exc:
        raise PublishError(f"not a safetensors file: {exc}") from exc


def _write_metadata(repo: ModelRepository, name: str, version: int, header: policies_pb2.PublishHeader) -> None:
    """The version's lineage beside its weights (Fetch and List read it back after a restart), atomically and
    durably (bridge.common.files)."""
    meta = policies_pb2.PolicyVersion(version=version, sha256=header.sha256, lineage=header.lineage,
                                      published_unix_ns=time.time_ns())
    write_text(repo.root / name / str(version) / "tether.json", json_format.MessageToJson(meta))


def read_metadata(repo: ModelRepository, name: str, version: int) -> policies_pb2.PolicyVersion | None:
    path = repo.root / name / str(version) / "tether.json"
    if not path.exists():
        return None
    return json_format.Parse(path.read_text(), policies_pb2.PolicyVersion())
