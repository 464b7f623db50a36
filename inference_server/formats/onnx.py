"""ONNX: one self-contained model file, served by onnxruntime in Triton's python backend (onnx_model.py),
every version of a policy from one process if asked (versions_model.py, `--persistent-versions`).

An imported file is parsed as the protobuf it is, never run here before it is served; a module-written
version is exported from its TorchScript and checked against it (inference_server.onnx_export).

    ONNX.detect(data)                               # parses as a non-empty ONNX model
    ONNX.read_specs(data)                           # the graph's inputs/outputs, without the batch dimension
    ONNX.check(data, inputs, outputs)               # ArtifactError naming what does not fit
    onnx_weights(data)                              # its initializers by name (for the integrity check)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

import inference_server.onnx_export as onnx_export
from inference_server.artifact import ArtifactError
from protos.codec import Spec

_DTYPES = {1: "float32", 11: "float64", 10: "float16", 6: "int32", 7: "int64", 2: "uint8", 9: "bool"}
_HERE = Path(__file__).parents[1]


class Onnx:
    """The ONNX format (see the module docstring; the members are those of formats.PolicyFormat)."""

    name = "onnx"
    kind = "an ONNX model"
    runtime = "onnxruntime"
    file = "policy.onnx"
    wrapper = _HERE / "onnx_model.py"
    versions_model: Mapping[str, Path] = MappingProxyType({"model.py": _HERE / "versions_model.py",
                                                           "onnx_model.py": _HERE / "onnx_model.py"})

    def detect(self, data: bytes) -> bool:
        try:
            _model(data)
        except ArtifactError:
            return False
        return True

    def read_specs(self, data: bytes) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
        graph = _model(data).graph
        initializers = {t.name for t in graph.initializer}
        return (tuple(_spec(v) for v in graph.input if v.name not in initializers),
                tuple(_spec(v) for v in graph.output))

    def check(self, data: bytes, inputs: tuple[Spec, ...], outputs: tuple[Spec, ...]) -> None:
        import onnx

        model = _model(data)
        external = [t.name for t in _tensors(model.graph) if t.data_location == onnx.TensorProto.EXTERNAL]
        if external:
            raise ArtifactError(f"the ONNX model keeps tensors {external[:5]} in external files: import one "
                                "self-contained file (onnx.save(model, path, save_as_external_data=False))")
        try:
            onnx.checker.check_model(model)
        except Exception as exc:
            raise ArtifactError(f"the ONNX model does not pass onnx.checker: {exc}") from None
        graph_inputs, graph_outputs = self.read_specs(data)
        _match("input", inputs, graph_inputs, exact=True)
        _match("output", outputs, graph_outputs, exact=False)
        for value in [*model.graph.input, *model.graph.output]:
            batch = _dims(value)[0] if _dims(value) else None
            if isinstance(batch, int) and batch != 1:
                raise ArtifactError(f"ONNX tensor {value.name!r} has a fixed batch dimension {batch}: export it "
                                    "with a dynamic first axis (or 1)")

    def weights(self, data: bytes) -> dict[str, torch.Tensor]:
        import torch
        return {name: torch.from_numpy(np.array(array)) for name, array in onnx_weights(data).items()
                if array.dtype.kind in "fiub" and array.dtype != np.uint64}

    def run(self, data: bytes, feed: Mapping[str, np.ndarray], inputs: Sequence[Spec],
            outputs: Sequence[Spec]) -> dict[str, np.ndarray]:
        import onnxruntime as ort

        names = [s.name for s in outputs]
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])
        feed = {s.name: feed[s.name] for s in inputs}
        batch = len(next(iter(feed.values())))
        rows = [{k: v[i:i + 1] for k, v in feed.items()} for i in range(batch)] \
            if onnx_batch_is_fixed(data) else [feed]
        runs = [session.run(names, row) for row in rows]
        return {name: np.concatenate([r[j] for r in runs]) for j, name in enumerate(names)}

    def export(self, scripted: torch.jit.ScriptModule, inputs: Sequence[Spec], outputs: Sequence[Spec]) -> bytes:
        return onnx_export.export(scripted, inputs, outputs)

    def reweight(self, base: Path, scripted: torch.jit.ScriptModule, into: Path) -> None:
        graph = base.read_bytes()
        into.write_bytes(onnx_export.reweight(graph, scripted, *self.read_specs(graph)))


ONNX = Onnx()


def onnx_weights(data: bytes) -> dict[str, np.ndarray]:
    """An ONNX model's initializers by name (its weights), read without running anything."""
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in _model(data).graph.initializer}


def onnx_batch_is_fixed(data: bytes) -> bool:
    """True when the ONNX graph's inputs take exactly one row (batch dimension fixed at 1)."""
    graph = _model(data).graph
    initializers = {t.name for t in graph.initializer}
    return any(_dims(v)[:1] == [1] for v in graph.input if v.name not in initializers)


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


def _model(data: bytes):
    import onnx

    try:
        model = onnx.load_model_from_string(bytes(data))
    except Exception as exc:
        raise ArtifactError(f"neither a TorchScript archive nor an ONNX model ({len(data)} bytes): "
                            f"{type(exc).__name__}: {exc}") from None
    if not model.graph.node and not model.graph.output:
        raise ArtifactError(f"the {len(data)} bytes parse as an empty ONNX model: not an ONNX file")
    return model


def _dims(value) -> list[int | str | None]:
    shape = value.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim]


def _spec(value) -> Spec:
    elem = value.type.tensor_type.elem_type
    if elem not in _DTYPES:
        raise ArtifactError(f"ONNX tensor {value.name!r} has element type {elem}, not one of "
                            f"{sorted(_DTYPES.values())}")
    dims = _dims(value)
    if len(dims) < 2:
        raise ArtifactError(f"ONNX tensor {value.name!r} has rank {len(dims)}: a policy's tensors are "
                            "[batch, ...] with at least one dimension after the batch")
    rest = dims[1:]
    if not all(isinstance(d, int) and d >= 1 for d in rest):
        raise ArtifactError(f"ONNX tensor {value.name!r} has shape {dims}: only the first (batch) dimension "
                            "may be dynamic")
    return Spec(value.name, np.dtype(_DTYPES[elem]), tuple(rest))


def _tensors(graph) -> Iterator:
    """Every TensorProto of `graph`, its initializers, constant attributes and subgraphs."""
    yield from graph.initializer
    yield from (s.values for s in graph.sparse_initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for g in attr.graphs:
                yield from _tensors(g)
