"""A content-addressed artifact store: every file of a policy version stored once, by its sha256, and version
folders materialized from it into any number of Triton model repositories (one per replica).

    store = ArtifactStore(Path("shared/artifacts"))
    digest = store.put_version(primary.root / "policy" / "4")     # -> the manifest's sha256 (64 hex digits)
    store.materialize(digest, replica.root / "policy" / "4")       # the same files, renamed into place
    store.blob(digest)                                             # shared/artifacts/sha256/<hex>

Layout: `<root>/sha256/<hex>` holds one blob per distinct content (read-only, written beside its place and
renamed into it, fsynced); a version is a manifest blob, JSON `{"files": {"policy.pt": "<hex>", ...}}`, and the
version's digest is the manifest's sha256. Two versions with the same bytes share their blobs; the same version
put twice is stored once. `materialize` hard-links the blobs into the target when it is on the same filesystem
(copies otherwise), builds the folder beside its final place and renames it in: a Triton that scans the
repository never sees half a version. Blobs are never changed in place, so a hard link is safe to share.

Errors name the bad value:

    >>> import tempfile
    >>> ArtifactStore(Path(tempfile.mkdtemp())).materialize("nothex", Path("x"))
    Traceback (most recent call last):
    ...
    ValueError: artifact digest 'nothex' must be 64 lowercase hex digits
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from bridge.common.files import write_atomic
from inference_server.repository import fsync_dir, fsync_tree, staging_folder

_HEX = re.compile(r"[0-9a-f]{64}")
_SKIPPED = ("__pycache__",)  # what Python writes beside a model.py it imported: not part of the version


class ArtifactStore:
    """Blobs by sha256 under `root/sha256/`, and version manifests over them (see the module docstring)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def blob(self, digest: str) -> Path:
        """Where the blob of `digest` lives (whether or not it is stored)."""
        return self.root / "sha256" / _check_digest(digest)

    def put(self, data: bytes) -> str:
        """Store `data` once; its sha256 (hex). Already stored: nothing is written."""
        digest = hashlib.sha256(data).hexdigest()
        path = self.blob(digest)
        if not path.exists():
            write_atomic(path, data, mode=0o444)
        return digest

    def put_version(self, folder: Path | str) -> str:
        """Every file under a version `folder` stored as a blob, then its manifest; the manifest's sha256."""
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"version folder {folder} does not exist")
        files = {}
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if path.is_file() and not any(part in _SKIPPED for part in relative.parts):
                files[relative.as_posix()] = self.put(path.read_bytes())
        return self.put(json.dumps({"files": files}, sort_keys=True).encode())

    def manifest(self, digest: str) -> dict[str, str]:
        """The files of a stored version: relative path -> blob digest."""
        path = self.blob(digest)
        if not path.exists():
            raise FileNotFoundError(f"artifact {digest} is not in the store {self.root}")
        files = json.loads(path.read_bytes())["files"]
        for name, blob in files.items():
            _check_digest(blob)
            if name.startswith("/") or ".." in Path(name).parts:
                raise ValueError(f"artifact {digest} names the file {name!r} outside its folder")
        return files

    def materialize(self, digest: str, target: Path | str) -> Path:
        """The version `digest` as the folder `target` (which must not exist), built beside it and renamed in."""
        files = self.manifest(_check_digest(digest))
        target = Path(target)
        if target.exists():
            raise FileExistsError(f"{target} already exists: a version folder is never overwritten")
        target.parent.mkdir(parents=True, exist_ok=True)
        with staging_folder(target.parent, f".{target.name}-") as staging:
            for name, blob in files.items():
                dest = staging / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(self.blob(blob), dest)
                except OSError:  # another filesystem (or no hard links): a copy
                    shutil.copyfile(self.blob(blob), dest)
            os.chmod(staging, 0o755)
            fsync_tree(staging)
            os.rename(staging, target)
            fsync_dir(target.parent)
        return target


def _check_digest(digest: str) -> str:
    if not isinstance(digest, str) or not _HEX.fullmatch(digest):
        raise ValueError(f"artifact digest {digest!r} must be 64 lowercase hex digits")
    return digest
