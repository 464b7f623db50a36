"""What Triton serves against what the rollout needs: versions nobody needs are retired from the model repository
and unloaded, a version that must serve is restored and loaded, and after every load the READY list (and, for a
restored version, an output fingerprint) is checked: a swap that did not take effect raises `SwapFailed`.

    serving = ServingReconciler(control=client, catalog=catalog, repository=repo)
    keep = needed(registry.rollout("hopper"), gating_version) | sessions_acting_with("hopper")
    await serving.reconcile("hopper", keep)      # unload the rest; Triton must then serve exactly what is on disk
    await serving.serve("hopper", 3)             # READY (restored from .retired if need be) and fingerprinted

The caller holds its own lock around these (they change the repository and Triton's loaded versions together);
filesystem work (renames, fsyncs) runs off the event loop.

>>> from bridge.registry import Rollout
>>> sorted(needed(Rollout("hopper", 3, 2, None, 4, 0.25, {}, {"robot=a": 1}), None, 5))
[1, 2, 3, 4, 5]
"""

from __future__ import annotations

import asyncio
import logging

from bridge.gateway.replicas.pool import Reference, TritonReplicas
from bridge.gateway.versions.catalog import PolicyCatalog
from bridge.gateway.versions.publisher import read_metadata
from bridge.gateway.versions.verify import Fingerprint, SwapFailed, restore_version
from bridge.registry import Rollout
from inference_server import ModelRepository, PolicyClient
from inference_server.formats import ARCHITECTURE

log = logging.getLogger("tether.gateway")


def needed(rollout: Rollout, *more: int | None) -> set[int]:
    """The versions the rollout keeps serving: live, previous live, canary, shadow, pinned (and `more`)."""
    return {v for v in (rollout.live, rollout.previous_live, rollout.canary, rollout.shadow, *rollout.pins.values(),
                        *more) if v is not None}


class ServingReconciler:
    """Triton's loaded versions brought to the set a caller asks for (see the module docstring). Without a
    repository (a gateway over a Triton it does not manage) nothing is unloaded and nothing can be restored."""

    def __init__(self, *, control: PolicyClient, catalog: PolicyCatalog, repository: ModelRepository | None):
        self._control, self._catalog, self._repo = control, catalog, repository
        self.fingerprint = Fingerprint(control)
        # several Triton replicas (bridge.gateway.replicas.pool): a version serves only once verified on them
        self.replicas = control if isinstance(control, TritonReplicas) else None

    def retire(self, repo: ModelRepository, name: str, keep: set[int]) -> list[int]:
        """Move the version folders not in `keep` to .retired (blocking: call it in a thread); the next
        load_model unloads them. Returns the versions retired."""
        retired = [v for v in repo.versions(name) if v not in keep]
        for version in retired:
            repo.retire(name, version)
            log.info("policy %s v%d unloaded: no session acts with it and the rollout does not need it", name,
                     version)
        return retired

    async def reconcile(self, name: str, keep: set[int]) -> None:
        """Unload the versions not in `keep`; verify Triton serves exactly what is on disk."""
        if self._repo is None:
            return
        if not await asyncio.to_thread(self.retire, self._repo, name, keep):  # renames + fsyncs: off the loop
            return
        await self._control.load_model(name)
        await self.verify_ready(name)

    async def verify_ready(self, name: str) -> list[int]:
        """Triton's READY versions of `name`, which must be the repository's: SwapFailed otherwise."""
        expected = self._repo.versions(name)
        ready = await self._control.ready_versions(name)
        if ready != expected:
            raise SwapFailed(f"policy {name!r}: Triton serves versions {ready} after load_model, the repository "
                             f"holds {expected}")
        return ready

    async def serve(self, name: str, version: int) -> None:
        """Make sure `version` is READY (restoring a retired folder, loading it, checking its fingerprint)."""
        ready = await self._control.ready_versions(name)
        if version not in ready:
            if self._repo is None:
                raise SwapFailed(f"policy {name!r} v{version} is not served by Triton (ready: {ready}) and this "
                                 "gateway has no model repository to load it from")
            await asyncio.to_thread(restore_version, self._repo, name, version)
            await self._control.load_model(name)
            ready = await self.verify_ready(name)
            if version not in ready:
                raise SwapFailed(f"policy {name!r} v{version} is not READY after load_model (ready: {ready})")
            served = await self._catalog.ensure(name, version)
            await self.verify_replicas(name, version)
            await self.fingerprint.verify(self._repo, served)
        if self.replicas is not None and not self.replicas.verified_on(name, version):
            await self.verify_replicas(name, version)  # READY, but not verified by this gateway (another loaded it)
            self.replicas.require_verified(name, version)
        await self._catalog.ensure(name, version)

    async def verify_replicas(self, name: str, version: int, header=None) -> None:
        """With several Triton replicas: `version` checked on each (READY, the trainer's probe batch of `header`
        when given, else the version file's outputs, reproduced within the gate's tolerance) and recorded;
        ReplicaVerificationFailed when a reachable replica is wrong. One Triton: nothing (the gate checks it)."""
        if self.replicas is not None:
            await self.replicas.verify(name, version, Reference.of(header) if header is not None else None)

    async def ready(self, name: str) -> list[int]:
        """Triton's READY versions of `name`; [] (logged) when Triton cannot say."""
        try:
            return await self._control.ready_versions(name)
        except Exception as exc:
            log.warning("rollout: cannot list versions of %s in Triton: %s", name, exc)
            return []

    def sha256(self, name: str, version: int) -> str:
        """The digest of a version found serving: the one its tether.json recorded, else the file's."""
        meta = read_metadata(self._repo, name, version) if self._repo is not None else None
        if meta is not None and len(meta.sha256) == 64:
            return meta.sha256.lower()
        return self.fingerprint.file_digest(self._repo, name, version)

    def format_on_disk(self, name: str, version: int) -> str:
        imported = self._repo.imported_format(name, version) if self._repo is not None else None
        return imported or ARCHITECTURE.name  # a module-written version's own file: its TorchScript
