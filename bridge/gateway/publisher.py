"""New weights in, a served and verified policy version out.

    publisher = Publisher(repository=ModelRepository(root), client=policy_client, catalog=catalog,
                          in_use=lambda name: {3, 4})
    reply = await publisher.publish(header, data)   # a PublishReply, or a PublishError saying why
    header, data = publisher.fetch("pendulum", 0)   # the newest version's weights, as published

`publish` checks the bytes (size, sha256, safetensors, every tensor against the architecture,
all finite), writes the version folder, retires versions nobody acts with, has Triton load the
model, checks that the new version is READY, runs the probe batch through Triton at exactly that
version and compares it with the trainer's outputs. Only then do sessions move to it
(`catalog.promote`). A version that fails any of this is retired again and never served.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable

import grpc
import numpy as np
import safetensors.torch
from google.protobuf import json_format

from bridge.gateway.errors import GatewayError
from bridge.gateway.policies import PolicyCatalog
from inference_server import ModelRepository, PolicyClient
from protos import policies_pb2
from protos.codec import TensorError, decode_all

log = logging.getLogger("tether.gateway")
KEEP_PREVIOUS = 1  # versions kept loaded beside the newest and those in use (a quick way back)


class PublishError(GatewayError):
    status = grpc.StatusCode.INVALID_ARGUMENT


class VerificationFailed(PublishError):
    """The version loaded but Triton does not serve what the trainer computed."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class Publisher:
    def __init__(self, *, repository: ModelRepository | None, client: PolicyClient, catalog: PolicyCatalog,
                 in_use: Callable[[str], set[int]]):
        self._repo = repository
        self._client = client
        self._catalog = catalog
        self._in_use = in_use
        self._lock = asyncio.Lock()

    def _repository(self) -> ModelRepository:
        if self._repo is None:
            raise PublishError("this gateway was started without --model-repository: it cannot publish")
        return self._repo

    async def publish(self, header: policies_pb2.PublishHeader, data: bytes) -> policies_pb2.PublishReply:
        repo = self._repository()
        started = time.monotonic()
        weights = _check_bytes(header, data)
        current = await self._catalog.resolve(header.policy)
        async with self._lock:
            name = current.name
            version = max([*repo.versions(name), *repo.retired_versions(name), current.version]) + 1
            self._retire_unused(repo, name, keep={current.version})
            try:
                await asyncio.to_thread(repo.write_weights, name, version, weights, base_version=current.version)
            except ValueError as exc:
                raise PublishError(f"policy {name!r}: {exc}") from exc
            _write_metadata(repo, name, version, header)
            try:
                ready = await self._load(name, version)
                error = await self._verify(name, version, header)
            except BaseException:
                await self._withdraw(repo, name, version)
                raise
            await self._catalog.promote(name, version)
        seconds = time.monotonic() - started
        log.info("policy %s v%d published (parent v%d, trainer step %d) and verified: max abs error %.2e, "
                 "%.2f s", name, version, header.lineage.parent_version, header.lineage.trainer_step, error, seconds)
        return policies_pb2.PublishReply(policy=name, version=version, sha256=header.sha256, ready_versions=ready,
                                         max_abs_error=error, load_seconds=seconds)

    def _retire_unused(self, repo: ModelRepository, name: str, *, keep: set[int]) -> None:
        versions = repo.versions(name)
        keep = keep | self._in_use(name) | set(versions[-1 - KEEP_PREVIOUS:])
        for version in versions:
            if version not in keep:
                repo.retire(name, version)
                log.info("policy %s v%d retired: no session acts with it", name, version)

    async def _load(self, name: str, version: int) -> list[int]:
        await self._client.load_model(name)
        ready = await self._client.ready_versions(name)
        if version not in ready:
            raise VerificationFailed(f"policy {name!r} v{version} is not READY in Triton after load_model "
                                     f"(ready: {ready})")
        return ready

    async def _verify(self, name: str, version: int, header: policies_pb2.PublishHeader) -> float:
        """Run the probe batch at exactly `version`; the worst absolute error against the trainer's."""
        try:
            inputs, expected = decode_all(header.probe_inputs), decode_all(header.probe_outputs)
        except TensorError as exc:
            raise PublishError(f"probe: {exc}") from exc
        if not inputs or not expected:
            raise PublishError("a publish needs probe_inputs and probe_outputs: the served version is checked "
                               "against them")
        got = await self._client.infer(name, version, inputs, list(expected))
        worst = 0.0
        for key, want in expected.items():
            served = got[key].astype(np.float64)
            want = want.astype(np.float64)
            if served.shape != want.shape:
                raise VerificationFailed(f"probe output {key!r}: Triton serves shape {list(served.shape)}, "
                                         f"the trainer computed {list(want.shape)}")
            error = float(np.max(np.abs(served - want))) if want.size else 0.0
            tolerance = header.atol or 1e-4 * (1.0 + float(np.max(np.abs(want), initial=0.0)))
            if not error <= tolerance:
                raise VerificationFailed(f"policy {name!r} v{version} serves probe output {key!r} with max abs "
                                         f"error {error:.3g} > {tolerance:.3g} against the trainer's: a wrong export, "
                                         "a dtype slip or stale weights")
            worst = max(worst, error)
        return worst

    async def _withdraw(self, repo: ModelRepository, name: str, version: int) -> None:
        if version in repo.versions(name):
            repo.retire(name, version)
        try:
            await self._client.load_model(name)  # unloads it
        except Exception as exc:
            log.error("policy %s: unloading the failed v%d: %s", name, version, exc)

    def fetch(self, name: str, version: int) -> tuple[policies_pb2.PublishHeader, bytes]:
        """The weights of `version` (a version on disk) as safetensors bytes, with their header."""
        repo = self._repository()
        try:
            state = repo.state_dict(name, version)
        except (FileNotFoundError, ValueError) as exc:
            raise PublishError(str(exc)) from exc
        data = safetensors.torch.save(state)
        header = policies_pb2.PublishHeader(policy=name, format="safetensors", size=len(data),
                                            sha256=hashlib.sha256(data).hexdigest())
        meta = read_metadata(repo, name, version)
        if meta is not None:
            header.lineage.CopyFrom(meta.lineage)
        return header, data


def _check_bytes(header: policies_pb2.PublishHeader, data: bytes) -> dict:
    if header.format != "safetensors":
        raise PublishError(f"format {header.format!r}: weights travel as 'safetensors'")
    if len(data) != header.size:
        raise PublishError(f"received {len(data)} bytes, the header announced {header.size}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != header.sha256.lower():
        raise PublishError(f"sha256 mismatch: received {digest}, the header says {header.sha256}")
    try:
        return safetensors.torch.load(data)
    except Exception as exc:
        raise PublishError(f"not a safetensors file: {exc}") from exc


def _write_metadata(repo: ModelRepository, name: str, version: int, header: policies_pb2.PublishHeader) -> None:
    """The version's lineage beside its weights (Fetch and List read it back after a restart)."""
    meta = policies_pb2.PolicyVersion(version=version, sha256=header.sha256, lineage=header.lineage,
                                      published_unix_ns=time.time_ns())
    path = repo.root / name / str(version) / "tether.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json_format.MessageToJson(meta))
    tmp.replace(path)


def read_metadata(repo: ModelRepository, name: str, version: int) -> policies_pb2.PolicyVersion | None:
    path = repo.root / name / str(version) / "tether.json"
    if not path.exists():
        return None
    return json_format.Parse(path.read_text(), policies_pb2.PolicyVersion())
