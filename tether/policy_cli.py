"""`tether policy import FILE --policy NAME`: bring your own policy, a TorchScript module or an ONNX file.

    tether policy import walker.onnx --policy walker --gateway 127.0.0.1:50051
    tether policy import arm.pt --policy arm --obs obs:float32:11 --action action:float32:3:-1:1
    tether policy inspect walker.onnx          # the specs the file declares, as tether.json
    tether policy import arm.onnx --policy arm --gateway gw.lab:50051 --tls-ca ca.crt --token $TETHER_TOKEN

The file travels whole as a `tether.v1.Policies.Publish` (header.format "torchscript" or "onnx",
chunked, sha256) with its specs: declared with --obs/--action (NAME:DTYPE:SHAPE[:LOW:HIGH]) or
read from the file (an ONNX graph's inputs/outputs; a TorchScript archive's `tether.json`, saved
with `torch.jit.save(m, path, _extra_files={"tether.json": specs_to_json(inputs, outputs)})`).
Here, on the user's machine, the file is run on a probe batch (random within the observation
bounds, fixed seed) and its outputs go along, so that the gateway's gate checks what Triton serves
against them exactly as for a trainer's publish. A new NAME creates a policy; an existing one gets
a new version (its specs must match). As a library (plain text: it needs a gateway):

    policy = read_policy_file(Path("walker.onnx"))
    probe = probe_inputs(policy.inputs, batch=8, seed=0)
    reply = publish(address, publish_chunks(policy, "walker", probe, reference_outputs(policy, probe)))
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bridge.client import Credentials, PoliciesClient
from bridge.client.policies import CHUNK_BYTES
from bridge.common.errors import CommandError
from bridge.common.flags import deprecated_alias, gateway_flags, policy_flag
from inference_server.artifact import ArtifactError, parse_spec, specs_to_json
from inference_server.formats import FORMATS, check_artifact, detect, format_named
from protos import codec, policies_pb2
from protos.codec import Spec


@dataclass(frozen=True)
class PolicyFile:
    """An imported policy file with the specs it is served with (no batch dimension)."""

    format: str
    data: bytes
    inputs: tuple[Spec, ...]
    outputs: tuple[Spec, ...]
    source: str = ""


def read_policy_file(path: Path, *, format: str | None = None, inputs: Sequence[Spec] = (),
                     outputs: Sequence[Spec] = ()) -> PolicyFile:
    """Read `path`, tell its format, take the declared specs (or the file's) and check them
    statically; ArtifactError naming what is wrong."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read {path}: {exc.strerror or exc}") from None
    fmt = format_named(format) if format else detect(data)
    declared = fmt.read_specs(data)
    inputs = tuple(inputs) or (declared[0] if declared else ())
    outputs = tuple(outputs) or (declared[1] if declared else ())
    if not inputs or not outputs:
        raise ArtifactError(f"{path} declares no specs: pass --obs and --action (NAME:DTYPE:SHAPE[:LOW:HIGH]) "
                            "or save a tether.json in the TorchScript archive")
    check_artifact(fmt.name, data, inputs, outputs)
    return PolicyFile(fmt.name, data, inputs, outputs, source=Path(path).name)


def probe_inputs(inputs: Sequence[Spec], *, batch: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    """A probe batch: uniform within each tensor's bounds where both are given, else standard
    normal (integers: within the bounds or 0..9; bool: random). Fixed by `seed`.

    >>> probe = probe_inputs([Spec("obs", np.float32, (3,), (-1.0,), (1.0,))], batch=4)
    >>> probe["obs"].shape, probe["obs"].dtype.name, bool(np.abs(probe["obs"]).max() <= 1)
    ((4, 3), 'float32', True)
    """
    if batch < 1:
        raise ValueError(f"probe batch {batch} must be >= 1")
    rng = np.random.default_rng(seed)
    arrays = {}
    for spec in inputs:
        shape = (batch, *spec.shape)
        low = np.broadcast_to(np.asarray(spec.low, np.float64), spec.shape) if spec.low else None
        high = np.broadcast_to(np.asarray(spec.high, np.float64), spec.shape) if spec.high else None
        if spec.dtype.kind == "b":
            value = rng.random(shape) < 0.5
        elif spec.dtype.kind in "iu":
            lo = low if low is not None else 0
            hi = high if high is not None else 9
            value = rng.integers(lo, np.asarray(hi) + 1, size=shape)
        elif low is not None and high is not None and np.isfinite(low).all() and np.isfinite(high).all():
            value = rng.uniform(low, high, size=shape)
        else:
            value = rng.standard_normal(shape)
        arrays[spec.name] = np.ascontiguousarray(value, dtype=spec.dtype)
    return arrays


def reference_outputs(policy: PolicyFile, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the file here (its format's `run`: torch.jit.load, onnxruntime) on `inputs`; its outputs by name,
    checked against the declared output specs (ArtifactError naming the output that does not fit)."""
    batch = len(next(iter(inputs.values())))
    try:
        outputs = format_named(policy.format).run(policy.data, inputs, policy.inputs, policy.outputs)
    except ArtifactError:
        raise
    except Exception as exc:
        shapes = {k: list(v.shape) for k, v in inputs.items()}
        raise ArtifactError(f"the {policy.format} file fails on a probe batch {shapes}: "
                            f"{type(exc).__name__}: {exc}") from None
    for spec in policy.outputs:
        got = outputs[spec.name]
        if got.shape != (batch, *spec.shape) or got.dtype != spec.dtype:
            raise ArtifactError(f"output {spec.name!r} is {got.dtype.name}{list(got.shape)} for a batch of {batch}, "
                                f"declared {spec.dtype.name}{[batch, *spec.shape]}")
    return outputs


def publish_chunks(policy: PolicyFile, name: str, inputs: Mapping[str, np.ndarray],
                   outputs: Mapping[str, np.ndarray], *, atol: float = 0.0,
                   chunk_bytes: int = CHUNK_BYTES) -> Iterator[policies_pb2.PublishChunk]:
    """The Publish stream of an import: a header (format, size, sha256, specs, probe), then the file."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes {chunk_bytes} must be >= 1")
    lineage = policies_pb2.Lineage(trainer=f"import:{policy.source or 'file'}@{socket.gethostname()}:{os.getpid()}")
    header = policies_pb2.PublishHeader(
        policy=name, format=policy.format, size=len(policy.data), sha256=hashlib.sha256(policy.data).hexdigest(),
        lineage=lineage, probe_inputs=codec.encode_all(inputs), probe_outputs=codec.encode_all(outputs), atol=atol,
        inputs=[s.to_proto() for s in policy.inputs], outputs=[s.to_proto() for s in policy.outputs])
    yield policies_pb2.PublishChunk(header=header)
    view = memoryview(policy.data)
    for start in range(0, len(view), chunk_bytes):
        yield policies_pb2.PublishChunk(data=bytes(view[start:start + chunk_bytes]))


def publish(address: str, chunks: Iterable[policies_pb2.PublishChunk], *, timeout_s: float = 300.0,
            credentials: Credentials | None = None) -> policies_pb2.PublishReply:
    """Send a Publish stream to the gateway at `address` (TLS and token: `credentials`); grpc.RpcError says
    why it was refused."""
    with PoliciesClient(address, credentials, timeout_s=timeout_s) as client:
        return client.publish_stream(chunks)


class ImportRefused(RuntimeError):
    """The gateway refused an import; the message names the file, the gateway, the status and its reason."""


def import_policy_file(address: str, path: Path, *, name: str, format: str | None = None,
                       obs: Sequence[str] = (), action: Sequence[str] = (), probe_batch: int = 8, seed: int = 0,
                       atol: float = 0.0, chunk_bytes: int = CHUNK_BYTES, timeout_s: float = 300.0,
                       credentials: Credentials | None = None) -> tuple[PolicyFile, policies_pb2.PublishReply]:
    """What `tether policy import PATH --policy NAME` does: read the file (specs from it or `obs`/`action`
    as NAME:DTYPE:SHAPE[:LOW:HIGH]), probe it here, publish it to the gateway at `address` (with
    `credentials`); returns the file read and the gateway's reply (its `version`). ArtifactError/ValueError for
    a bad file or spec, ImportRefused when the gateway says no."""
    import grpc

    policy = read_policy_file(path, format=format, inputs=[parse_spec(s) for s in obs],
                              outputs=[parse_spec(s) for s in action])
    probe = probe_inputs(policy.inputs, batch=probe_batch, seed=seed)
    expected = reference_outputs(policy, probe)
    try:
        return policy, publish(address, publish_chunks(policy, name, probe, expected, atol=atol,
                                                       chunk_bytes=chunk_bytes), timeout_s=timeout_s,
                               credentials=credentials)
    except grpc.RpcError as exc:
        raise ImportRefused(f"the gateway at {address} refused {path} ({exc.code().name}): {exc.details()}") from None


def import_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether policy import",
                                description="Import a TorchScript module or an ONNX file as a policy version.")
    p.add_argument("file", type=Path, help="a TorchScript archive (.pt, a zip) or an ONNX file")
    policy_flag(p, required=True, help="the policy: a new name creates it, an existing one gets a version")
    deprecated_alias(p, "--name", "--policy")
    gateway_flags(p, token_help="operator token NAME.SECRET")
    p.add_argument("--format", choices=FORMATS, help="default: told from the file (a zip is TorchScript)")
    p.add_argument("--obs", action="append", default=[], metavar="NAME:DTYPE:SHAPE[:LOW:HIGH]",
                   help="an observation tensor the policy takes (repeat; default: read from the file)")
    p.add_argument("--action", action="append", default=[], metavar="NAME:DTYPE:SHAPE[:LOW:HIGH]",
                   help="an action tensor the policy gives (repeat; default: read from the file)")
    p.add_argument("--probe-batch", type=int, default=8, help="rows of the probe batch the gate checks Triton with")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe batch")
    p.add_argument("--atol", type=float, default=0.0, help="served-vs-file tolerance (0 = per dtype)")
    p.add_argument("--chunk-bytes", type=int, default=CHUNK_BYTES, help="bytes per Publish message")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole import")
    return p


def inspect_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tether policy inspect", description="The specs a policy file declares.")
    p.add_argument("file", type=Path, help="a TorchScript archive or an ONNX file")
    return p


def parsers() -> dict[str, argparse.ArgumentParser]:
    return {"tether policy import": import_parser(), "tether policy inspect": inspect_parser()}


def _import(argv: list[str]) -> None:
    a = import_parser().parse_args(argv)
    try:
        policy, reply = import_policy_file(a.gateway, a.file, name=a.policy, format=a.format, obs=a.obs,
                                           action=a.action, probe_batch=a.probe_batch, seed=a.seed, atol=a.atol,
                                           chunk_bytes=a.chunk_bytes, timeout_s=a.timeout,
                                           credentials=Credentials.from_args(a))
    except (ArtifactError, ValueError, ImportRefused) as exc:
        raise CommandError(exc, prog="tether policy import") from None
    print(f"imported {a.file} ({policy.format}, {len(policy.data) / 1e6:.1f} MB) as {reply.policy} v{reply.version}: "
          f"served and verified (max abs error {reply.max_abs_error:.2e}, {reply.load_seconds:.2f} s), "
          f"Triton serves versions {list(reply.ready_versions)}", flush=True)


def _inspect(argv: list[str]) -> None:
    a = inspect_parser().parse_args(argv)
    try:
        data = a.file.read_bytes()
        fmt = detect(data)
        specs = fmt.read_specs(data)
    except (OSError, ArtifactError) as exc:
        raise CommandError(exc, prog="tether policy inspect") from None
    if specs is None:
        raise CommandError(f"{a.file} is a TorchScript archive without tether.json: declare --obs/--action when "
                           "importing it", prog="tether policy inspect")
    print(f"# {a.file}: {fmt.name}\n{specs_to_json(*specs)}")


def main(argv: list[str]) -> None:
    commands = {"import": _import, "inspect": _inspect}
    if not argv or argv[0] not in commands:
        print(f"usage: tether policy {{{','.join(commands)}}} FILE [options]\n{__doc__}", file=sys.stderr)
        raise SystemExit(2)
    commands[argv[0]](argv[1:])
