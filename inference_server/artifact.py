"""Imported policy files (TorchScript or ONNX): their format, their specs and a static check.

Nothing here runs the file: a TorchScript archive is opened as the zip it is (never
`torch.jit.load`ed in this process) and an ONNX file is parsed as the protobuf it is. Running it
is Triton's job (`ModelRepository.write_artifact`, then load and probe the version).

    fmt = detect_format(data)                         # "torchscript" (a zip) or "onnx"
    inputs, outputs = read_specs(fmt, data)           # ONNX graph / TorchScript's tether.json, or None
    check_artifact(fmt, data, inputs, outputs)        # ArtifactError naming what does not fit
    onnx_weights(data)                                # an ONNX file's initializers (for the integrity check)
    imported_file(fmt, data, inputs, outputs)         # checked, with its readable weights: for write_artifact

Specs on a command line are NAME:DTYPE:SHAPE[:LOW:HIGH], shape and bounds comma-separated:

    >>> s = parse_spec("action:float32:2:-1:1")
    >>> s.name, s.dtype.name, s.shape, s.low, s.high
    ('action', 'float32', (2,), (-1.0,), (1.0,))
    >>> parse_spec("obs:float32:3,0")
    Traceback (most recent call last):
    ...
    inference_server.artifact.ArtifactError: spec 'obs:float32:3,0': shape dimensions must be >= 1, got [3, 0]

A TorchScript file carries its specs in a `tether.json` extra file (`torch.jit.save(module, path,
_extra_files={"tether.json": specs_to_json(inputs, outputs)})`):

    >>> text = specs_to_json([parse_spec("obs:float32:3")], [parse_spec("action:float32:2:-1:1")])
    >>> [s.name for s in specs_from_json(text)[1]]
    ['action']
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator, Sequence

import numpy as np

from protos.codec import Spec, TensorError

FORMATS = ("torchscript", "onnx")
SPEC_FILE = "tether.json"
ARTIFACT_FILES = {"torchscript": "policy.pt", "onnx": "policy.onnx"}
_ONNX_DTYPES = {1: "float32", 11: "float64", 10: "float16", 6: "int32", 7: "int64", 2: "uint8", 9: "bool"}


class ArtifactError(ValueError):
    """An imported file or spec that cannot be served; the message names the bad value."""


def detect_format(data: bytes) -> str:
    """ "torchscript" for a zip archive, "onnx" for anything else that parses as an ONNX model."""
    if data[:4] == b"PK\x03\x04":
        return "torchscript"
    _onnx_model(data)
    return "onnx"


def parse_spec(text: str) -> Spec:
    """NAME:DTYPE:SHAPE[:LOW:HIGH] -> Spec (bounds: one value for all elements, or one per element)."""
    parts = text.split(":")
    if len(parts) not in (3, 5):
        raise ArtifactError(f"spec {text!r} must be NAME:DTYPE:SHAPE or NAME:DTYPE:SHAPE:LOW:HIGH")
    name, dtype, shape = parts[:3]
    try:
        dims = [int(d) for d in shape.split(",")]
        low, high = ((tuple(float(v) for v in parts[i].split(",")) for i in (3, 4)) if len(parts) == 5
                     else ((), ()))
    except ValueError:
        raise ArtifactError(f"spec {text!r}: shape and bounds must be comma-separated numbers") from None
    if any(d < 1 for d in dims):
        raise ArtifactError(f"spec {text!r}: shape dimensions must be >= 1, got {dims}")
    try:
        spec = Spec(name, np.dtype(dtype), tuple(dims), low, high)
    except (TypeError, TensorError) as exc:
        raise ArtifactError(f"spec {text!r}: {exc}") from None
    _check_bounds(spec)
    return spec


def _check_bounds(spec: Spec) -> None:
    size = int(np.prod(spec.shape))
    for what, values in (("low", spec.low), ("high", spec.high)):
        if len(values) not in (0, 1, size):
            raise ArtifactError(f"tensor {spec.name!r}: {len(values)} {what} bounds for {size} elements")
    if spec.low and spec.high and not np.all(np.asarray(spec.low) <= np.asarray(spec.high)):
        raise ArtifactError(f"tensor {spec.name!r}: low {list(spec.low)} above high {list(spec.high)}")


def specs_to_json(inputs: Sequence[Spec], outputs: Sequence[Spec]) -> str:
    def entry(s: Spec) -> dict:
        return {"name": s.name, "dtype": s.dtype.name, "shape": list(s.shape), "low": list(s.low),
                "high": list(s.high)}

    return json.dumps({"inputs": [entry(s) for s in inputs], "outputs": [entry(s) for s in outputs]}, indent=1)


def specs_from_json(text: str | bytes) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    try:
        doc = json.loads(text)
        return tuple(tuple(Spec(e["name"], np.dtype(e["dtype"]), tuple(e["shape"]), tuple(e.get("low", ())),
                                tuple(e.get("high", ()))) for e in doc[key]) for key in ("inputs", "outputs"))
    except (ValueError, TypeError, KeyError) as exc:
        raise ArtifactError(f"{SPEC_FILE} is not a spec file ({{'inputs': [...], 'outputs': [...]}}): "
                            f"{type(exc).__name__}: {exc}") from None


def read_specs(fmt: str, data: bytes) -> tuple[tuple[Spec, ...], tuple[Spec, ...]] | None:
    """The specs the file declares: an ONNX graph's inputs/outputs (without the batch dimension),
    a TorchScript archive's tether.json, or None (TorchScript without one)."""
    if fmt == "onnx":
        graph = _onnx_model(data).graph
        initializers = {t.name for t in graph.initializer}
        return (tuple(_onnx_spec(v) for v in graph.input if v.name not in initializers),
                tuple(_onnx_spec(v) for v in graph.output))
    if fmt == "torchscript":
        archive = _zip(data)
        path = _root(archive) + "/extra/" + SPEC_FILE
        return specs_from_json(archive.read(path)) if path in archive.namelist() else None
    raise ArtifactError(f"format {fmt!r} must be one of {FORMATS}")


def check_artifact(fmt: str, data: bytes, inputs: Sequence[Spec], outputs: Sequence[Spec]) -> None:
    """ArtifactError unless `data` is a well-formed file of format `fmt` taking `inputs` and giving
    `outputs` (with a leading batch dimension). Static: the file is not run."""
    inputs, outputs = tuple(inputs), tuple(outputs)
    for spec in inputs + outputs:
        _check_bounds(spec)
    if fmt == "torchscript":
        archive = _zip(data)
        root = _root(archive)
        for needed in (f"{root}/data.pkl", f"{root}/code/"):
            if not any(n.startswith(needed) for n in archive.namelist()):
                raise ArtifactError(f"the zip archive has no {needed}: not a TorchScript module "
                                    "(save it with torch.jit.save)")
        declared = read_specs(fmt, data)
        if declared is not None and declared != (inputs, outputs):
            raise ArtifactError(f"the specs given differ from the archive's {SPEC_FILE}: {_names(declared)} vs "
                                f"{_names((inputs, outputs))}")
        return
    if fmt != "onnx":
        raise ArtifactError(f"format {fmt!r} must be one of {FORMATS}")
    import onnx

    model = _onnx_model(data)
    external = [t.name for t in _onnx_tensors(model.graph) if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise ArtifactError(f"the ONNX model keeps tensors {external[:5]} in external files: import one "
                            "self-contained file (onnx.save(model, path, save_as_external_data=False))")
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise ArtifactError(f"the ONNX model does not pass onnx.checker: {exc}") from None
    graph_inputs, graph_outputs = read_specs(fmt, data)
    _match("input", inputs, graph_inputs, exact=True)
    _match("output", outputs, graph_outputs, exact=False)
    for value in [*model.graph.input, *model.graph.output]:
        batch = _onnx_dims(value)[0] if _onnx_dims(value) else None
        if isinstance(batch, int) and batch != 1:
            raise ArtifactError(f"ONNX tensor {value.name!r} has a fixed batch dimension {batch}: export it with "
                                "a dynamic first axis (or 1)")


class ImportedFile(dict):
    """An imported file checked statically, ready for `ModelRepository.write_artifact`: a dict of
    its weights (torch tensors: an ONNX file's initializers; a TorchScript archive's state_dict,
    read in a subprocess by inference_server.torchscript_weights), with the file and its specs."""

    def __init__(self, fmt: str, data: bytes, inputs: tuple[Spec, ...], outputs: tuple[Spec, ...], weights: dict):
        super().__init__(weights)
        self.format, self.data, self.inputs, self.outputs = fmt, data, inputs, outputs


def imported_file(fmt: str, data: bytes, inputs: Sequence[Spec], outputs: Sequence[Spec]) -> ImportedFile:
    """`check_artifact`, then the file with its readable weights (see ImportedFile)."""
    inputs, outputs = tuple(inputs), tuple(outputs)
    if not inputs or not outputs:
        raise ArtifactError(f"an imported {fmt} file travels with its input and output specs; got inputs "
                            f"{[s.name for s in inputs]}, outputs {[s.name for s in outputs]}")
    check_artifact(fmt, data, inputs, outputs)
    if fmt == "onnx":
        import torch

        weights = {name: torch.from_numpy(np.array(array)) for name, array in onnx_weights(data).items()
                   if array.dtype.kind in "fiub" and array.dtype != np.uint64}
    else:
        from inference_server.torchscript_weights import read_weights

        weights = read_weights(data)
    return ImportedFile(fmt, data, inputs, outputs, weights)


def onnx_weights(data: bytes) -> dict[str, np.ndarray]:
    """An ONNX model's initializers by name (its weights), read without running anything."""
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in _onnx_model(data).graph.initializer}


def onnx_batch_is_fixed(data: bytes) -> bool:
    """True when the ONNX graph's inputs take exactly one row (batch dimension fixed at 1)."""
    graph = _onnx_model(data).graph
    initializers = {t.name for t in graph.initializer}
    return any(_onnx_dims(v)[:1] == [1] for v in graph.input if v.name not in initializers)


def _names(specs: tuple[tuple[Spec, ...], tuple[Spec, ...]]) -> str:
    return " -> ".join(str([f"{s.name}:{s.dtype.name}{list(s.shape)}" for s in side]) for side in specs)


def _match(kind: str, declared: tuple[Spec, ...], graph: tuple[Spec, ...], *, exact: bool) -> None:
    found = {s.name: s for s in graph}
    for spec in declared:
        got = found.get(spec.name)
        if got is None:
            raise ArtifactError(f"the ONNX graph has no {kind} {spec.name!r}; its {kind}s are {sorted(found)}")
        if got.dtype != spec.dtype or got.shape != spec.shape:
            raise ArtifactError(f"ONNX {kind} {spec.name!r} is {got.dtype.name}{list(got.shape)}, declared "
                                f"{spec.dtype.name}{list(spec.shape)}")
    missing = sorted(found.keys() - {s.name for s in declared})
    if exact and missing:
        raise ArtifactError(f"the ONNX graph also takes {kind}s {missing}, which the declared specs lack")


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


def _onnx_model(data: bytes):
    import onnx

    try:
        model = onnx.load_model_from_string(bytes(data))
    except Exception as exc:
        raise ArtifactError(f"neither a TorchScript archive nor an ONNX model ({len(data)} bytes): "
                            f"{type(exc).__name__}: {exc}") from None
    if not model.graph.node and not model.graph.output:
        raise ArtifactError(f"the {len(data)} bytes parse as an empty ONNX model: not an ONNX file")
    return model


def _onnx_dims(value) -> list[int | str | None]:
    shape = value.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim]


def _onnx_spec(value) -> Spec:
    elem = value.type.tensor_type.elem_type
    if elem not in _ONNX_DTYPES:
        raise ArtifactError(f"ONNX tensor {value.name!r} has element type {elem}, not one of "
                            f"{sorted(_ONNX_DTYPES.values())}")
    dims = _onnx_dims(value)
    if len(dims) < 2:
        raise ArtifactError(f"ONNX tensor {value.name!r} has rank {len(dims)}: a policy's tensors are "
                            "[batch, ...] with at least one dimension after the batch")
    rest = dims[1:]
    if not all(isinstance(d, int) and d >= 1 for d in rest):
        raise ArtifactError(f"ONNX tensor {value.name!r} has shape {dims}: only the first (batch) dimension "
                            "may be dynamic")
    return Spec(value.name, np.dtype(_ONNX_DTYPES[elem]), tuple(rest))


def _onnx_tensors(graph) -> Iterator:
    """Every TensorProto of `graph`, its initializers, constant attributes and subgraphs."""
    yield from graph.initializer
    yield from (s.values for s in graph.sparse_initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _onnx_tensors(attr.g)
            for g in attr.graphs:
                yield from _onnx_tensors(g)
