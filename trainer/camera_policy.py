"""`CameraChunkPolicy`: images + state -> a chunk of H actions (H = 16, 50, ...), or one action (`horizon=None`).

Each camera has its own small CNN encoder (three strided convolutions, then a spatial softmax: the expected (x, y)
of each feature map, where things are in the image); their keypoints and the state vector go through an MLP head
to H x A actions, squashed into the action's bounds. Images enter as the uint8 (B, H, W, 3) tensors cameras send
(`sim.cameras`); scaling to [-0.5, 0.5] is part of the served function, so Triton gets the raw bytes. It exports
to TorchScript and ONNX like every module-written version (`ModelRepository.write_version(..., serve="onnx")`):

    >>> import numpy as np, torch
    >>> from protos.codec import RAW, Spec
    >>> state = Spec("observation", np.float32, (4,))
    >>> cams = [Spec("top", np.uint8, (64, 64, 3)), Spec("front", np.uint8, (64, 64, 3))]
    >>> act = Spec("action", np.float32, (2,), low=(-1.0,), high=(1.0,))
    >>> policy = CameraChunkPolicy(state, cams, act, horizon=16, seed=0)
    >>> [(s.name, s.shape) for s in policy.inputs], policy.outputs[0].shape
    ([('observation', (4,)), ('top', (64, 64, 3)), ('front', (64, 64, 3))], (16, 2))
    >>> chunk = policy(torch.zeros(3, 4), torch.zeros(3, 64, 64, 3, dtype=torch.uint8),
    ...                torch.zeros(3, 64, 64, 3, dtype=torch.uint8))
    >>> tuple(chunk.shape), bool((chunk.abs() <= 1).all())
    ((3, 16, 2), True)
    >>> CameraChunkPolicy(state, [Spec("top", np.float32, (64, 64, 3))], act)
    Traceback (most recent call last):
    ...
    ValueError: camera top: expected uint8 (H, W, 3) images, got float32[64, 64, 3]

`policy.inputs`/`policy.outputs` are the specs to serve it with (`repo.write_version(name, 1, policy,
policy.inputs, policy.outputs)`); forward takes the inputs positionally in that order (state first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from protos.codec import RAW, Spec
from trainer.policy import _register_bounds, _squash

__all__ = ["CameraChunkPolicy", "ImageEncoder", "camera_policy_for", "chunk_spec"]


def chunk_spec(action: Spec, horizon: int | None) -> Spec:
    """The served output for `action` (A,) and `horizon` H: (H, A) with the bounds repeated per row; `action` itself
    when `horizon` is None."""
    if horizon is None:
        return action
    if isinstance(horizon, bool) or not isinstance(horizon, int) or not 1 <= horizon <= 10_000:
        raise ValueError(f"horizon must be an integer in [1, 10000] (or None: one action), got {horizon!r}")
    size = int(np.prod(action.shape))
    repeat = (lambda side: side if len(side) <= 1 else tuple(side) * horizon) if size > 1 else (lambda side: side)
    return Spec(action.name, action.dtype, (horizon, *action.shape), low=repeat(action.low), high=repeat(action.high))


class ImageEncoder(nn.Module):
    """uint8 (B, H, W, 3) -> (B, 2 * channels[-1]) keypoints: convolutions (stride 2 while the maps stay at least 8x8),
    then a spatial softmax."""

    def __init__(self, spec: Spec, *, channels: tuple[int, ...] = (16, 32, 32)):
        super().__init__()
        if spec.dtype != np.uint8 or len(spec.shape) != 3 or spec.shape[2] != 3:
            raise ValueError(f"camera {spec.name}: expected uint8 (H, W, 3) images, got "
                             f"{spec.dtype.name}{list(spec.shape)}")
        layers: list[nn.Module] = []
        width, side = 3, min(spec.shape[:2])
        for i, out in enumerate(channels):
            kernel = 5 if i == 0 else 3
            stride = 2 if side // 2 >= 8 else 1  # small images keep maps of at least 8x8: keypoints need room
            layers += [nn.Conv2d(width, out, kernel, stride=stride, padding=kernel // 2), nn.ReLU()]
            width, side = out, (side + stride - 1) // stride
        self.convs = nn.Sequential(*layers[:-1])  # keypoints from the last convolution's raw maps
        with torch.no_grad():
            _, _, h, w = self.convs(torch.zeros(1, 3, spec.shape[0], spec.shape[1])).shape
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
        self.register_buffer("grid", torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=1))  # (h*w, 2)
        self.features = 2 * width

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image.permute(0, 3, 1, 2).float() / 255.0 - 0.5
        maps = self.convs(x)
        attention = torch.softmax(maps.flatten(2), dim=-1)  # (B, C, h*w)
        return (attention @ self.grid).flatten(1)             # (B, 2C): expected (x, y) per channel


class CameraChunkPolicy(nn.Module):
    """A deterministic image + state policy: `forward(state, *images) -> (B, horizon, A)` (or (B, A))."""

    def __init__(self, state: Spec, cameras: Sequence[Spec], action: Spec, *, horizon: int | None = 16,
                 channels: tuple[int, ...] = (16, 32, 32), hidden: tuple[int, ...] = (256, 256),
                 seed: int | None = None):
        super().__init__()
        cameras = tuple(dataclasses.replace(c, encoding=RAW) for c in cameras)  # Triton gets decoded pixels
        if len(state.shape) != 1 or state.dtype.kind != "f":
            raise ValueError(f"state {state.name}: expected a float vector, got {state.dtype.name}{list(state.shape)}")
        if len(action.shape) != 1:
            raise ValueError(f"action {action.name}: expected a vector, got {list(action.shape)}")
        if not cameras:
            raise ValueError("a camera policy needs at least one camera spec")
        if seed is not None:
            torch.manual_seed(seed)
        output = chunk_spec(action, horizon)
        self.inputs, self.outputs = (state, *cameras), (output,)
        self.encoders = nn.ModuleList([ImageEncoder(c, channels=channels) for c in cameras])
        sizes = (state.shape[0] + sum(e.features for e in self.encoders), *hidden)
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.head = nn.Sequential(*layers, nn.Linear(sizes[-1], int(np.prod(output.shape))))
        self.shape = output.shape
        flat = Spec(output.name, output.dtype, (int(np.prod(output.shape)),), low=output.low, high=output.high)
        _register_bounds(self, flat)

    def forward(self, state: torch.Tensor, *images: torch.Tensor) -> torch.Tensor:
        features = [state.float()] + [encoder(image) for encoder, image in zip(self.encoders, images, strict=True)]
        out = _squash(self.head(torch.cat(features, dim=1)), self.bounded, self.center, self.half_range)
        return out.reshape((-1, *self.shape))


def _row(bounds: tuple[float, ...], size: int) -> tuple[float, ...]:
    """One row's bounds of a chunk's (one for all, or per element per row: the first row's)."""
    return tuple(bounds) if len(bounds) <= 1 else tuple(bounds)[:size]


def camera_policy_for(inputs: Sequence[Spec], outputs: Sequence[Spec], *, state_dict: dict | None = None,
                      seed: int | None = None) -> CameraChunkPolicy:
    """The `CameraChunkPolicy` served with `inputs` (the state, then the cameras) and `outputs` (one chunk (H, A), or
    one action (A,)), with the convolution channels and head sizes of `state_dict` when given (a served version's
    weights: load them next). ValueError naming what does not fit.

    >>> import numpy as np
    >>> p = CameraChunkPolicy(Spec("s", np.float32, (3,)), [Spec("cam", np.uint8, (16, 16, 3))],
    ...                       Spec("a", np.float32, (2,), low=(-1.0,), high=(1.0,)), horizon=4, hidden=(32,))
    >>> q = camera_policy_for(p.inputs, p.outputs, state_dict=p.state_dict())
    >>> q.load_state_dict(p.state_dict()), q.outputs == p.outputs
    (<All keys matched successfully>, True)
    """
    if len(outputs) != 1 or len(outputs[0].shape) not in (1, 2):
        raise ValueError(f"a camera policy has one output, a chunk (H, A) or an action (A,); got "
                         f"{[f'{s.name}{list(s.shape)}' for s in outputs]}")
    if len(inputs) < 2:
        raise ValueError(f"a camera policy takes a state and cameras, got {[s.name for s in inputs]}")
    out = outputs[0]
    horizon = out.shape[0] if len(out.shape) == 2 else None
    size = out.shape[-1]
    action = Spec(out.name, out.dtype, (size,), low=_row(out.low, size), high=_row(out.high, size))
    sizes = {}
    if state_dict is not None:
        def widths(prefix: str) -> list[int]:
            found = sorted((int(k[len(prefix):].split(".")[0]), v) for k, v in state_dict.items()
                           if k.startswith(prefix) and k.endswith(".weight"))
            return [int(w.shape[0]) for _, w in found]
        channels, head = widths("encoders.0.convs."), widths("head.")
        if not channels or not head:
            raise ValueError(f"no encoders.0.convs.* / head.* weights among {sorted(state_dict)[:6]}: not the "
                             "weights of a camera policy")
        sizes = {"channels": tuple(channels), "hidden": tuple(head[:-1])}
    return CameraChunkPolicy(inputs[0], inputs[1:], action, horizon=horizon, seed=seed, **sizes)
