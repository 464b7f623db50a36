"""Version folders copied from the primary model repository into each Triton replica's own, through the
content-addressed artifact store: each version stored once (by sha256), materialized into every repository that
lacks it; versions the primary no longer holds retired there too; the model's config.pbtxt kept equal.

    copies = VersionCopies(primary=ModelRepository("a"), store=ArtifactStore("a/.tether/artifacts"))
    copies.sync(ModelRepository("b"), "hopper")    # b/hopper/<v> == a/hopper/<v> for every v (blocking: a thread)
    copies.digests[("hopper", 4)]                  # the manifest sha256 version 4 is stored under

A repository that is the primary itself (replicas sharing one repository) is left as it is.
"""

from __future__ import annotations

import logging
import shutil

from bridge.common.files import write_text
from inference_server import ModelRepository
from inference_server.artifacts import ArtifactStore
from inference_server.repository import fsync_dir

log = logging.getLogger("tether.gateway")


class VersionCopies:
    def __init__(self, *, primary: ModelRepository, store: ArtifactStore):
        self.primary, self.store = primary, store
        self.digests: dict[tuple[str, int], str] = {}  # version folders never change once installed

    def sync(self, repository: ModelRepository, model: str) -> None:
        """`repository` made to hold exactly the primary's version folders of `model` (and its config)."""
        if repository.root.resolve() == self.primary.root.resolve():
            return
        if not (self.primary.root / model / "config.pbtxt").exists():
            return  # not a model of the primary repository: nothing to give the replicas
        want, have = set(self.primary.versions(model)), set(repository.versions(model))
        folder = repository.root / model
        for version in sorted(have - want):  # out of Triton's sight (kept under .retired, as the primary does)
            retired = repository.root / ".retired" / model / str(version)
            retired.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(retired, ignore_errors=True)
            (folder / str(version)).rename(retired)
            fsync_dir(folder)
        for version in sorted(want - have):
            self.store.materialize(self.digest(model, version), folder / str(version))
        config = (self.primary.root / model / "config.pbtxt").read_text()
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "config.pbtxt"
        if not target.exists() or target.read_text() != config:
            write_text(target, config)

    def digest(self, model: str, version: int) -> str:
        """The primary's folder of `version` in the store (stored on first use); its manifest sha256."""
        key = (model, version)
        if key not in self.digests:
            self.digests[key] = self.store.put_version(self.primary.root / model / str(version))
            log.info("policy %s v%d stored once as sha256 %s", model, version, self.digests[key])
        return self.digests[key]
