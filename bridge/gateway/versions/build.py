"""A large version checked and built apart from the gateway: a child process, at a lower CPU priority,
reads the uploaded safetensors file, runs the gate's integrity check (names, shapes, dtypes against the
base version, every value finite, the digest) and builds the version folder in the upload's scratch
folder; the gateway then only renames it into place (`ModelRepository.install`). Neither the tensors nor
the TorchScript ever live in the gateway's memory, and no GIL the gateway's event loop needs is held.

    integrity, built = await build_apart(root=repo.root, model="pendulum", base=3, upload=upload,
                                         sha256=header.sha256)   # BuildFailed if unreadable
    if integrity.passed:
        repo.install("pendulum", 4, built)

Each build is a process forked from a fork server that imported torch once (the first large publish
starts it), so a build pays no interpreter start or torch import; it exits when done, giving its memory back.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from bridge.gate.checks import CheckResult
from bridge.gateway.versions.uploads import finished

NICE = 10  # below the gateway, Triton and the sims: the sessions' steps come first on a busy machine
_PRELOAD = ["torch", "safetensors.torch", "bridge.gate.checks", "inference_server.repository"]
_pool: ProcessPoolExecutor | None = None


class BuildFailed(ValueError):
    """The child could not read the upload or build the version folder (its reason)."""


async def build_apart(*, root: Path, model: str, base: int, upload, sha256: str,
                      nice: int = NICE) -> tuple[CheckResult, Path | None]:
    """Integrity of `upload` (an `uploads.Upload`) and, when it passes, its version folder built in
    `upload.scratch`. Returns the check and the folder (None when the check failed). A cancelled caller
    waits for the child to finish (it writes into the scratch folder the caller removes)."""
    upload.scratch.mkdir()
    submit = functools.partial(_executor().submit, build, root=str(root), model=model, base=base,
                               weights=str(upload.path), sha256=sha256, digest=upload.sha256,
                               into=str(upload.scratch), nice=nice)  # the first starts the fork server
    future = await finished(asyncio.get_running_loop().run_in_executor(None, submit))
    try:
        reply = await finished(future)
    except BrokenProcessPool as exc:  # the child died (killed, out of memory): the next build gets a new pool
        _reset()
        raise BuildFailed(f"the process building the version died: {exc}") from None
    result = CheckResult(reply["name"], reply["passed"], {k: float(v) for k, v in reply["figures"].items()},
                         reply["detail"])
    return result, (upload.scratch if result.passed else None)


def build(*, root: str, model: str, base: int, weights: str, sha256: str, digest: str, into: str,
          nice: int = NICE) -> dict:
    """In the child: the integrity check's dict (CheckResult.to_dict) and, when it passed, the folder built."""
    os.nice(nice)
    import safetensors.torch

    from bridge.gate import checks
    from inference_server import ModelRepository

    repo = ModelRepository(Path(root))
    started = time.monotonic()
    try:
        tensors = safetensors.torch.load_file(weights)
    except Exception as exc:
        raise BuildFailed(f"not a safetensors file: {exc}") from None
    try:
        architecture = repo.state_dict(model, base)
    except (FileNotFoundError, ValueError):
        architecture = None
    result = checks.integrity(tensors, architecture, sha256=sha256, digest=digest)
    del architecture
    if result.passed:
        try:
            repo.build_weights(model, tensors, base_version=base, into=Path(into))
        except (ValueError, FileNotFoundError) as exc:
            raise BuildFailed(str(exc)) from None
    return {**result.to_dict(), "figures": {**result.to_dict()["figures"],
                                            "seconds": round(time.monotonic() - started, 4)}}


def _executor() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        _pool = ProcessPoolExecutor(1, mp_context=context, max_tasks_per_child=1)
    return _pool


def _reset() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False)
        _pool = None
