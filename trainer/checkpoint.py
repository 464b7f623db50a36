"""Checkpoints a restarted run resumes from: model, optimiser, step, data position, RNG states.

One folder per checkpoint, `step-00000012/`: `model.safetensors` (the trainer's modules),
`optimizer.pt` (torch.save, loaded with weights_only=True), `meta.json` (step, data position,
versions), and `rank{r}.pt` per rank (its RNG states). The folder is assembled under a hidden
name and renamed into place, then `latest` is replaced atomically: a crash at any point leaves
the previous checkpoint intact. Every rank calls `save` (a collective); rank 0 writes the
shared files.

    >>> import tempfile, torch
    >>> d = tempfile.mkdtemp()
    >>> model = torch.nn.Linear(2, 1)
    >>> opt = torch.optim.Adam(model.parameters())
    >>> _ = save(d, step=3, model=model, optimizer=opt, meta={"data": [5]}, rng={"torch": torch.get_rng_state()})
    >>> ckpt = load(d)
    >>> ckpt.step, ckpt.meta["data"], sorted(ckpt.rng)
    (3, [5], ['torch'])
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from bridge.common.files import fsync_dir, write_atomic
from trainer import dist

__all__ = ["Checkpoint", "latest", "load", "save"]

KEEP = 2


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict
    meta: dict
    rng: dict[str, torch.Tensor]


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _torch_bytes(obj) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def save(root: str | Path, *, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, meta: dict,
         rng: dict[str, torch.Tensor]) -> Path:
    """Write checkpoint `step` (every rank calls this; each rank's `rng` goes to its own file).

    `meta` carries the loop's counters (step, iteration, the newest published version, data
    offsets) so that a run resumed on any node, by a group of any size, continues from them:
    no step redone past the checkpoint, no version number taken twice. `world_size` is added."""
    from safetensors.torch import save as st_save

    root = Path(root)
    rank, _ = dist.world()
    final = root / f"step-{step:08d}"
    staging = root / f".step-{step:08d}.partial"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    dist.barrier()
    _write(staging / f"rank{rank}.pt", _torch_bytes({k: v.detach().cpu() for k, v in rng.items()}))
    dist.barrier()
    if rank == 0:
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        _write(staging / "model.safetensors", st_save(state))
        _write(staging / "optimizer.pt", _torch_bytes(optimizer.state_dict()))
        meta = {**meta, "step": step, "world_size": dist.world()[1]}
        _write(staging / "meta.json", json.dumps(meta, sort_keys=True).encode())
        fsync_dir(staging)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(staging, final)
        write_atomic(root / "latest", final.name.encode(), mode=0o644)  # fsyncs root: the rename above too
        for old in sorted(root.glob("step-*"))[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint folder under `root`, or None."""
    root = Path(root)
    pointer = root / "latest"
    if pointer.is_file():
        path = root / pointer.read_text().strip()
        if (path / "meta.json").is_file():
            return path
    complete = [p for p in sorted(root.glob("step-*")) if (p / "meta.json").is_file()]
    return complete[-1] if complete else None


def load(root: str | Path, *, map_location: str | torch.device = "cpu") -> Checkpoint | None:
    """The newest checkpoint under `root` with this rank's RNG states; None when there is none."""
    from safetensors.torch import load_file

    path = latest(root)
    if path is None:
        return None
    rank, _ = dist.world()
    meta = json.loads((path / "meta.json").read_text())
    rank_file = path / f"rank{rank}.pt"
    rng = torch.load(rank_file, weights_only=True, map_location="cpu") if rank_file.is_file() else {}
    return Checkpoint(path=path, step=int(meta["step"]), model=load_file(path / "model.safetensors"),
                      optimizer=torch.load(path / "optimizer.pt", weights_only=True, map_location=map_location),
                      meta=meta, rng=rng)
