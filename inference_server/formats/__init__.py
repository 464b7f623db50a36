"""Policy formats: the kinds of policy file Triton serves, one module each, and their registry.

A format is told from a file's bytes, checked statically (never run in the gateway), served by its own
Triton python-backend wrapper, and (for a version written from a torch module) exported from the
TorchScript architecture. Adding one: docs/extending.md, "A policy format".

    fmt = detect(data)                              # TORCHSCRIPT (a zip) or ONNX
    fmt = format_named("onnx")                      # ArtifactError naming the known ones otherwise
    fmt.read_specs(data)                            # the specs the file declares, or None
    check_artifact("onnx", data, inputs, outputs)   # ArtifactError naming what does not fit
    imported_file("onnx", data, inputs, outputs)    # checked, with its readable weights: for write_artifact
    served_in(version_folder)                       # the format Triton serves a version folder in

    >>> [(f.name, f.file, f.runtime) for f in FORMATS.values()]
    [('torchscript', 'policy.pt', 'torch'), ('onnx', 'policy.onnx', 'onnxruntime')]
    >>> format_named("keras")
    Traceback (most recent call last):
    ...
    inference_server.artifact.ArtifactError: format 'keras' must be one of ('torchscript', 'onnx')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

from inference_server.artifact import ArtifactError, check_bounds
from inference_server.formats.onnx import ONNX
from inference_server.formats.torchscript import TORCHSCRIPT
from protos.codec import Spec


class PolicyFormat(Protocol):
    """One kind of policy file (formats/torchscript.py and formats/onnx.py are the two)."""

    name: str          # on the wire (PublishHeader.format), in artifact.json, on the command line (--format)
    kind: str          # in messages: "an ONNX model"
    runtime: str       # what serves it in Triton: "onnxruntime"
    file: str          # its file in a version folder: "policy.onnx"
    wrapper: Path      # the python-backend model.py that serves `file` (copied beside it)
    versions_model: Mapping[str, Path]  # files of one model serving every version of a policy ({}: none)

    def detect(self, data: bytes) -> bool:
        """True when `data` is a file of this format (magic bytes, or it parses)."""

    def read_specs(self, data: bytes) -> tuple[tuple[Spec, ...], tuple[Spec, ...]] | None:
        """The (inputs, outputs) the file declares, without the batch dimension; None if it declares none."""

    def check(self, data: bytes, inputs: tuple[Spec, ...], outputs: tuple[Spec, ...]) -> None:
        """ArtifactError unless `data` is a well-formed file taking `inputs` and giving `outputs` (with a
        leading batch dimension). Static: the file is not run."""

    def weights(self, data: bytes) -> dict[str, torch.Tensor]:
        """The file's weights by name (the gate's integrity check), read without running it in this process."""

    def run(self, data: bytes, feed: Mapping[str, np.ndarray], inputs: Sequence[Spec],
            outputs: Sequence[Spec]) -> dict[str, np.ndarray]:
        """The file run here on the batch `feed` (by input name): its outputs by name."""

    def export(self, scripted: torch.jit.ScriptModule, inputs: Sequence[Spec], outputs: Sequence[Spec]) -> bytes:
        """The file of a module-written version (`scripted` is its probed TorchScript)."""

    def reweight(self, base: Path, scripted: torch.jit.ScriptModule, into: Path) -> None:
        """Write at `into` the file of `scripted`, a version with the architecture of the file `base`."""


FORMATS: Mapping[str, PolicyFormat] = MappingProxyType({f.name: f for f in (TORCHSCRIPT, ONNX)})  # detect()'s order
ARCHITECTURE = TORCHSCRIPT  # a module-written version's own file: what new weights go into, whatever serves it


def format_named(name: str) -> PolicyFormat:
    """The format called `name`; ArtifactError (a ValueError) naming the known ones otherwise."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ArtifactError(f"format {name!r} must be one of {tuple(FORMATS)}") from None


def detect(data: bytes) -> PolicyFormat:
    """The format of `data`, tried in registry order; ArtifactError when it is none of them."""
    for fmt in FORMATS.values():
        if fmt.detect(data):
            return fmt
    raise ArtifactError(f"neither {' nor '.join(f.kind for f in FORMATS.values())} ({len(data)} bytes)")


def check_artifact(name: str, data: bytes, inputs: Sequence[Spec], outputs: Sequence[Spec]) -> None:
    """ArtifactError unless every spec's bounds fit it and `data` is a well-formed file of format `name`
    taking `inputs` and giving `outputs` (PolicyFormat.check)."""
    inputs, outputs = tuple(inputs), tuple(outputs)
    for spec in inputs + outputs:
        check_bounds(spec)
    format_named(name).check(data, inputs, outputs)


class ImportedFile(dict):
    """An imported file checked statically, ready for `ModelRepository.write_artifact`: a dict of its
    weights (torch tensors, PolicyFormat.weights), with the file, its format's name and its specs."""

    def __init__(self, fmt: str, data: bytes, inputs: tuple[Spec, ...], outputs: tuple[Spec, ...], weights: dict):
        super().__init__(weights)
        self.format, self.data, self.inputs, self.outputs = fmt, data, inputs, outputs


def imported_file(name: str, data: bytes, inputs: Sequence[Spec], outputs: Sequence[Spec]) -> ImportedFile:
    """`check_artifact`, then the file with its readable weights (see ImportedFile)."""
    inputs, outputs = tuple(inputs), tuple(outputs)
    if not inputs or not outputs:
        raise ArtifactError(f"an imported {name} file travels with its input and output specs; got inputs "
                            f"{[s.name for s in inputs]}, outputs {[s.name for s in outputs]}")
    check_artifact(name, data, inputs, outputs)
    return ImportedFile(name, data, inputs, outputs, format_named(name).weights(data))


def served_in(folder: Path) -> PolicyFormat:
    """The format Triton serves the version folder `folder` in: the one whose file sits there beside (or
    instead of) the TorchScript architecture, else TorchScript."""
    return next((f for f in FORMATS.values() if f is not ARCHITECTURE and (folder / f.file).exists()), ARCHITECTURE)
