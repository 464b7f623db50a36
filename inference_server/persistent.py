"""PolicyClient's methods over a Triton where a policy's ONNX versions are served by one persistent model
(`<policy>.versions`, inference_server/versions_model.py) instead of one stub process per version.

Callers keep addressing (policy, version); only this layer turns that into the persistent model plus the request
parameter `tether_version`. A version is READY when its files are on disk and a probe at that version answers
(the persistent model opens its policy.onnx at the first request naming it). Policies not `setup` here go
to Triton as before (a model per policy, a stub per version).

    client = PersistentVersions(PolicyClient(url), repo)
    await client.setup("pendulum")            # root/pendulum.versions written and loaded; stubs of pendulum unloaded
    await client.infer("pendulum", 7, {"observation": obs}, ["action"])   # v7's weights, opened lazily
    await client.ready_versions("pendulum")   # the versions on disk that answer a probe
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import numpy as np

from inference_server.client import InferenceError, PolicyClient
from inference_server.repository import VERSIONS_SUFFIX, ModelRepository, versions_model_name
from protos.codec import Spec

PARAMETER = "tether_version"  # versions_model.PARAMETER
_UNREACHABLE = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"}


class PersistentVersions:
    """See the module docstring. `policies`: a set shared by the clients of one gateway (its hot and control
    clients), filled by `setup`."""

    def __init__(self, client: PolicyClient, repository: ModelRepository, *, policies: set[str] | None = None):
        self.client, self.repository = client, repository
        self.policies = policies if policies is not None else set()
        self._io: dict[str, tuple[tuple[Spec, ...], tuple[Spec, ...]]] = {}

    url = property(lambda self: self.client.url)
    timeout_s = property(lambda self: self.client.timeout_s)

    async def setup(self, policy: str) -> bool:
        """Serve `policy`'s versions from its persistent model: the model written (`write_versions_model`) and
        loaded, the per-version model unloaded if Triton serves it. False (nothing changed) for a policy whose
        versions are not served by onnxruntime."""
        try:
            name = await asyncio.to_thread(self.repository.write_versions_model, policy)
        except ValueError:
            if policy.endswith(VERSIONS_SUFFIX):
                raise
            return False
        loaded = await self.client.loaded_models()
        if name not in loaded:
            await self.client.load_model(name)
        if policy in loaded:
            await self.client.unload_model(policy)
        self.policies.add(policy)
        return True

    def _check(self, model: str) -> bool:
        if model.endswith(VERSIONS_SUFFIX):
            raise InferenceError(f"model {model!r} is the persistent model of policy "
                                 f"{model.removesuffix(VERSIONS_SUFFIX)!r}: address that policy and a version",
                                 url=self.url, model=model, code="INVALID_ARGUMENT")
        return model in self.policies

    async def infer(self, model: str, version: int, inputs: Mapping[str, np.ndarray],
                    outputs: Sequence[str]) -> dict[str, np.ndarray]:
        if not self._check(model):
            return await self.client.infer(model, version, inputs, outputs)
        try:
            return await self.client.infer(versions_model_name(model), 1, inputs, outputs,
                                           parameters={PARAMETER: version})
        except InferenceError as exc:
            raise InferenceError(f"policy {model!r} version {version} (persistent model "
                                 f"{versions_model_name(model)!r}): {exc}", url=self.url, model=model,
                                 version=version, code=exc.code) from exc

    async def ready_versions(self, model: str) -> list[int]:
        """Persistent: the versions on disk that answer a probe (a zero batch of one row) at that version."""
        if not self._check(model):
            return await self.client.ready_versions(model)
        on_disk = await asyncio.to_thread(self.repository.versions, model)
        if not on_disk:
            return []
        try:
            inputs, outputs = await self._model_io(model)
        except InferenceError as exc:
            if exc.code in _UNREACHABLE:
                raise
            return []  # the persistent model is not loaded: nothing is READY
        probe = {s.name: np.zeros((1, *s.shape), s.dtype) for s in inputs}
        names = [s.name for s in outputs]
        answers = await asyncio.gather(*(self.infer(model, v, probe, names) for v in on_disk), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, InferenceError) and answer.code in _UNREACHABLE:
                raise answer
            if isinstance(answer, BaseException) and not isinstance(answer, InferenceError):
                raise answer
        return [v for v, answer in zip(on_disk, answers, strict=True) if not isinstance(answer, BaseException)]

    async def load_model(self, model: str, *, timeout_s: float = 60.0) -> None:
        """Persistent: the persistent model loaded if Triton lost it (a restart); versions open at their first
        request, retired ones are refused (their files are gone)."""
        if not self._check(model):
            return await self.client.load_model(model, timeout_s=timeout_s)
        name = versions_model_name(model)
        if name not in await self.client.loaded_models():
            await self.client.load_model(name, timeout_s=timeout_s)

    async def unload_model(self, model: str, *, timeout_s: float = 60.0) -> None:
        name = versions_model_name(model) if self._check(model) else model
        await self.client.unload_model(name, timeout_s=timeout_s)

    async def _model_io(self, model: str) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
        if model not in self._io:
            self._io[model] = await self.client.model_io(versions_model_name(model), 1)
        return self._io[model]

    async def model_io(self, model: str, version: int) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
        if not self._check(model):
            return await self.client.model_io(model, version)
        if version not in await asyncio.to_thread(self.repository.versions, model):
            raise InferenceError(f"policy {model!r} version {version} is not in {self.repository.root} (persistent "
                                 f"model {versions_model_name(model)!r})", url=self.url, model=model, version=version,
                                 code="NOT_FOUND")
        return await self._model_io(model)

    async def loaded_models(self) -> list[str]:
        """The policies served: a persistent model counts as its policy."""
        return sorted({m.removesuffix(VERSIONS_SUFFIX) for m in await self.client.loaded_models()})

    async def wait_ready(self, timeout: float) -> None:
        await self.client.wait_ready(timeout)

    async def live(self) -> bool:
        return await self.client.live()

    async def server_version(self) -> str:
        return await self.client.server_version()

    async def close(self) -> None:
        await self.client.close()


def persistent_clients(hot: PolicyClient, control: PolicyClient, repository: ModelRepository,
                       ) -> tuple[PersistentVersions, PersistentVersions]:
    """A gateway's hot-path and control clients, sharing which policies are persistent."""
    policies: set[str] = set()
    return (PersistentVersions(hot, repository, policies=policies),
            PersistentVersions(control, repository, policies=policies))

