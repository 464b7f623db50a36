"""TorchScript: a `torch.jit.save` archive, served by torch in Triton's python backend (triton_model.py).

It is also the architecture of every module-written version (`policy.pt`: what new weights are loaded into,
what Fetch returns), whichever format serves it: `script` makes it from a torch module, `probe` runs it on
zeros. The gateway never runs an imported archive in its own process: it is opened as the zip it is, its
weights read in a subprocess (inference_server.torchscript_weights); only `run` (`tether policy import`, on
the user's machine) loads one here.

    TORCHSCRIPT.detect(data)                        # a zip archive
    TORCHSCRIPT.read_specs(data)                    # its tether.json, or None
    TORCHSCRIPT.check(data, inputs, outputs)        # ArtifactError naming what does not fit
    scripted = script(module, observation_spec)     # torch.jit.script, or a trace on zeros
    probe(scripted, observation_spec, action_spec)  # ValueError naming an output that does not fit
"""

from __future__ import annotations

import io
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

from inference_server.artifact import SPEC_FILE, ArtifactError, specs_from_json
from inference_server.torchscript_weights import read_weights
from protos.codec import Spec

_ZIP_MAGIC = b"PK\x03\x04"
_PROBE_BATCH = 2


class TorchScript:
    """The TorchScript format (see the module docstring; the members are those of formats.PolicyFormat)."""

    name = "torchscript"
    kind = "a TorchScript archive"
    runtime = "torch"
    file = "policy.pt"
    wrapper = Path(__file__).parents[1] / "triton_model.py"
    versions_model: Mapping[str, Path] = MappingProxyType({})  # none: one stub process per version

    def detect(self, data: bytes) -> bool:
        return data[:4] == _ZIP_MAGIC

    def read_specs(self, data: bytes) -> tuple[tuple[Spec, ...], tuple[Spec, ...]] | None:
        archive = _zip(data)
        path = _root(archive) + "/extra/" + SPEC_FILE
        return specs_from_json(archive.read(path)) if path in archive.namelist() else None

    def check(self, data: bytes, inputs: tuple[Spec, ...], outputs: tuple[Spec, ...]) -> None:
        archive = _zip(data)
        root = _root(archive)
        for needed in (f"{root}/data.pkl", f"{root}/code/"):
            if not any(n.startswith(needed) for n in archive.namelist()):
                raise ArtifactError(f"the zip archive has no {needed}: not a TorchScript module "
                                    "(save it with torch.jit.save)")
        declared = self.read_specs(data)
        if declared is not None and declared != (inputs, outputs):
            raise ArtifactError(f"the specs given differ from the archive's {SPEC_FILE}: {_names(declared)} vs "
                                f"{_names((inputs, outputs))}")

    def weights(self, data: bytes) -> dict[str, torch.Tensor]:
        return read_weights(data)

    def run(self, data: bytes, feed: Mapping[str, np.ndarray], inputs: Sequence[Spec],
            outputs: Sequence[Spec]) -> dict[str, np.ndarray]:
        import torch
        names = [s.name for s in outputs]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            module = torch.jit.load(io.BytesIO(data), map_location="cpu").eval()
            with torch.inference_mode():
                result = module(*(torch.from_numpy(np.array(feed[s.name])) for s in inputs))
        result = (result,) if isinstance(result, torch.Tensor) else result
        if not isinstance(result, tuple | list) or not all(isinstance(t, torch.Tensor) for t in result):
            raise ArtifactError(f"the module must return a tensor or a tuple of tensors, got {type(result).__name__}")
        if len(result) != len(names):
            raise ArtifactError(f"the module returns {len(result)} tensors, the action specs name {names}")
        return {name: t.numpy() for name, t in zip(names, result, strict=True)}

    def export(self, scripted: torch.jit.ScriptModule, inputs: Sequence[Spec], outputs: Sequence[Spec]) -> bytes:
        import torch
        buffer = io.BytesIO()
        with warnings.catch_warnings():  # torch deprecates torch.jit; Triton's python backend loads it fine
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
            torch.jit.save(scripted, buffer)
        return buffer.getvalue()

    def reweight(self, base: Path, scripted: torch.jit.ScriptModule, into: Path) -> None:
        import torch
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
            torch.jit.save(scripted, str(into))  # straight to the file: no copy of it in memory


TORCHSCRIPT = TorchScript()


def _zeros(observation_spec: tuple[Spec, ...]) -> tuple[torch.Tensor, ...]:
    import torch
    return tuple(torch.from_numpy(np.zeros((_PROBE_BATCH, *s.shape), dtype=s.dtype))
                 for s in observation_spec)


def script(module: torch.nn.Module, observation_spec: tuple[Spec, ...]) -> torch.jit.ScriptModule:
    """torch.jit.script, or a trace on zeros when the module does not script."""
    import torch
    if isinstance(module, torch.jit.ScriptModule):
        scripted = module
    else:
        try:
            scripted = torch.jit.script(module)
        except Exception as script_error:
            was_training = module.training
            try:
                with torch.no_grad():
                    scripted = torch.jit.trace(module.eval(), _zeros(observation_spec), check_trace=False)
            except Exception as trace_error:
                raise ValueError(f"module {type(module).__name__} neither scripts ({script_error}) "
                                 f"nor traces ({trace_error})") from trace_error
            finally:
                module.train(was_training)
    return scripted.eval()


def probe(scripted: torch.jit.ScriptModule, observation_spec: tuple[Spec, ...], action_spec: tuple[Spec, ...]) -> None:
    """Run the policy on a zero batch; raise ValueError naming any output that does not fit."""
    import torch
    try:
        with torch.inference_mode():
            result = scripted(*_zeros(observation_spec))
    except Exception as exc:
        shapes = [[_PROBE_BATCH, *s.shape] for s in observation_spec]
        raise ValueError(f"the policy fails on zero observations of shapes {shapes}: {exc}") from exc
    if isinstance(result, torch.Tensor):
        result = (result,)
    if not isinstance(result, tuple | list) or not all(isinstance(t, torch.Tensor) for t in result):
        raise ValueError(f"the policy must return a tensor or a tuple of tensors, "
                         f"got {type(result).__name__}")
    if len(result) != len(action_spec):
        raise ValueError(f"the policy returns {len(result)} tensors, action spec names "
                         f"{[s.name for s in action_spec]}")
    for spec, tensor in zip(action_spec, result, strict=True):
        shape, expected = tuple(tensor.shape), (_PROBE_BATCH, *spec.shape)
        if shape != expected:
            raise ValueError(f"output {spec.name!r} has shape {list(shape)} for a batch of {_PROBE_BATCH}, "
                             f"expected {list(expected)}")
        dtype = tensor.numpy().dtype
        if dtype != spec.dtype:
            raise ValueError(f"output {spec.name!r} has dtype {dtype.name}, expected {spec.dtype.name}")


def _names(specs: tuple[tuple[Spec, ...], tuple[Spec, ...]]) -> str:
    return " -> ".join(str([f"{s.name}:{s.dtype.name}{list(s.shape)}" for s in side]) for side in specs)


def _zip(data: bytes) -> zipfile.ZipFile:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        bad = archive.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise ArtifactError(f"not a complete TorchScript archive (zip) of {len(data)} bytes: {exc}") from None
    if bad is not None:
        raise ArtifactError(f"TorchScript archive member {bad!r} fails its CRC check: a damaged file")
    return archive


def _root(archive: zipfile.ZipFile) -> str:
    roots = {name.split("/", 1)[0] for name in archive.namelist()}
    if len(roots) != 1:
        raise ArtifactError(f"a TorchScript archive has one top folder, this zip has {sorted(roots)[:5]}")
    return roots.pop()
