"""What the rollout controller needs from the model repository beyond writing versions: bringing a
retired version folder back, a file digest for versions found serving at start, and the output
fingerprint that proves Triton serves the weights on disk after a (re)load.

    restore_version(repo, "hopper", 3)                 # root/.retired/hopper/3 -> root/hopper/3
    await Fingerprint(client).verify(repo, served)     # SwapFailed if Triton's outputs differ from the file's

    >>> spec_dicts(())
    []
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import warnings
from collections.abc import Sequence

import grpc
import numpy as np

from bridge.gateway.errors import GatewayError
from bridge.gateway.versions.catalog import ServedPolicy
from inference_server import ModelRepository, PolicyClient
from inference_server.repository import fsync_dir
from protos.codec import Spec

PROBE_ROWS = 4
PROBE_SEED = 20260701


class SwapFailed(GatewayError, status=grpc.StatusCode.INTERNAL):
    """A load or unload did not take effect as asked (Triton serves other versions, or other weights)."""


def spec_dicts(specs: Sequence[Spec]) -> list[dict]:
    return [{"name": s.name, "dtype": np.dtype(s.dtype).name, "shape": list(s.shape)} for s in specs]


def restore_version(repo: ModelRepository, name: str, version: int) -> None:
    """Move a retired version folder back into the model (the inverse of `ModelRepository.retire`)."""
    if version in repo.versions(name):
        return
    source = repo.root / ".retired" / name / str(version)
    if not source.is_dir():
        raise SwapFailed(f"policy {name!r} v{version} is neither in the repository nor retired under {source.parent}")
    os.rename(source, repo.root / name / str(version))
    fsync_dir(source.parent)
    fsync_dir(repo.root / name)


class Fingerprint:
    """Triton's outputs at one version against the version file's own (TorchScript) outputs on a
    fixed probe batch; only outputs that are deterministic locally (equal on two runs) are compared."""

    def __init__(self, client: PolicyClient, *, rtol: float = 1e-4, atol: float = 1e-5):
        self._client, self._rtol, self._atol = client, rtol, atol

    @staticmethod
    def file_digest(repo: ModelRepository | None, name: str, version: int) -> str:
        """sha256 of the version's main file (a stand-in for the published digest of versions found serving)."""
        if repo is not None:
            for file in ("policy.pt", "policy.onnx", "model.onnx", "model.pt"):
                path = repo.root / name / str(version) / file
                if path.exists():
                    return hashlib.sha256(path.read_bytes()).hexdigest()
        return hashlib.sha256(f"{name}/{version}".encode()).hexdigest()

    async def verify(self, repo: ModelRepository, served: ServedPolicy) -> dict[str, float]:
        path = repo.root / served.name / str(served.version) / "policy.pt"
        if not path.exists() or repo.imported_format(served.name, served.version) is not None:
            return {}  # ONNX, or a user's imported TorchScript (never run in the gateway): the READY list is the check
        inputs = _probe(served.inputs)
        expected = await asyncio.to_thread(_local_outputs, str(path), served, inputs)
        if not expected:
            return {}
        got = await self._client.infer(served.name, served.version, inputs, list(expected))
        errors = {}
        for key, want in expected.items():
            have = got[key].astype(np.float64)
            if have.shape != want.shape or not np.all(np.abs(have - want) <= self._atol + self._rtol * np.abs(want)):
                worst = float(np.max(np.abs(have - want))) if have.shape == want.shape else float("inf")
                raise SwapFailed(f"policy {served.name!r} v{served.version}: Triton's output {key!r} differs from "
                                 f"the version file's by {worst:.3g}: stale or wrong weights are served")
            errors[key] = float(np.max(np.abs(have - want))) if want.size else 0.0
        return errors


def _probe(specs: Sequence[Spec]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(PROBE_SEED)
    out = {}
    for s in specs:
        if np.dtype(s.dtype).kind == "f":
            out[s.name] = rng.standard_normal((PROBE_ROWS, *s.shape)).astype(s.dtype)
        else:
            out[s.name] = np.zeros((PROBE_ROWS, *s.shape), s.dtype)
    return out


def _local_outputs(path: str, served: ServedPolicy, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import torch
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
        module = torch.jit.load(path, map_location="cpu").eval()
    args = [torch.from_numpy(inputs[s.name]) for s in served.inputs]
    runs = []
    with torch.inference_mode():
        for _ in range(2):
            result = module(*args)
            result = (result,) if isinstance(result, torch.Tensor) else tuple(result)
            runs.append({s.name: t.numpy().astype(np.float64) for s, t in zip(served.outputs, result, strict=False)})
    return {k: v for k, v in runs[0].items() if np.array_equal(v, runs[1][k])}
