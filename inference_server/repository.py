"""A Triton model repository: one folder per model, one numbered folder per policy version.

    root/<model>/config.pbtxt            python backend, dynamic batching, every version served
    root/<model>/<version>/policy.pt     the TorchScript policy (the architecture of a module-written version)
    root/<model>/<version>/model.py      the python-backend wrapper of the format serving it (triton_model.py)
    root/<model>/<version>/policy.onnx   or the file of another format (model.py: onnx_model.py, onnxruntime)
    root/<model>/<version>/artifact.json an imported version's format and sha256

The formats (TorchScript, ONNX: their files, wrappers, checks, exports) are in inference_server.formats.

A version folder is built beside its final place and renamed into it, so a running Triton
never sees half a version; its files and the folder are fsynced before the rename, the model
folder after it (`retire` fsyncs both folders), so a version a caller goes on to record survives a power cut.
Usage (plain text: writing a version TorchScripts the module):

    repo = ModelRepository(Path("runs/triton"))
    repo.write_version("policy", 1, mlp, obs_spec, action_spec)   # -> runs/triton/policy/1
    repo.versions("policy")                                        # -> [1]
    repo.write_weights("policy", 2, state_dict)   # version 1's architecture, new weights -> .../policy/2
    repo.state_dict("policy", 2)                  # the weights a version serves
    repo.retire("policy", 1)                      # out of Triton's sight (kept under root/.retired)
    repo.write_artifact("mine", 1, "onnx", data, inputs, outputs)  # an imported file, served as it is
    repo.serving_format("policy", 2)              # "torchscript" (torch) or "onnx" (onnxruntime) in Triton
    repo.write_versions_model("policy")           # -> "policy.versions": one process serving every ONNX version

Errors come early and name the bad value:

    >>> import tempfile
    >>> repo = ModelRepository(Path(tempfile.mkdtemp()))
    >>> repo.write_version("../etc", 1, None, (), ())
    Traceback (most recent call last):
    ...
    ValueError: model name '../etc' must match [A-Za-z0-9][A-Za-z0-9_.-]*
    >>> repo.versions("policy")
    []
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import py_compile
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

from bridge.common.files import fsync_dir, write_text
from inference_server.artifact import ArtifactError
from inference_server.formats import ARCHITECTURE, FORMATS, check_artifact, format_named, served_in
from inference_server.formats.torchscript import probe, script
from protos.codec import Spec, dtype_to_proto, triton_dtype

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_TENSOR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")
_ARTIFACT_JSON = "artifact.json"
VERSIONS_SUFFIX = ".versions"  # <policy>.versions: the persistent model of a policy's versions (versions_model.py)


class ModelRepository:
    """Writes TorchScript policies as versions of Triton python-backend models under `root`."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def versions(self, model: str) -> list[int]:
        """The version numbers on disk for `model`, ascending (whether or not Triton loaded them)."""
        folder = self.root / _check_model_name(model)
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir()
                      if p.is_dir() and p.name.isdigit() and not p.name.startswith("0"))

    def write_version(self, model: str, version: int, module: torch.nn.Module,
                      observation_spec: Sequence[Spec], action_spec: Sequence[Spec], *,
                      max_batch_size: int = 64, max_queue_delay_us: int = 100, serve: str = "torchscript") -> Path:
        """TorchScript `module` into `root/model/version` and (re)write the model's config.

        `module.forward` takes the observation tensors positionally in spec order, each with a
        leading batch dimension, and returns one tensor or a tuple in action-spec order. It is
        probed with zeros before anything is written. `serve`: the format that serves it (and every
        version `write_weights` makes from it), exported from the TorchScript (`PolicyFormat.export`):
        `serve="onnx"` serves it with onnxruntime, exported and checked (inference_server.onnx_export),
        a version then loads in a fraction of the time. Returns the version folder.
        """
        import torch
        if serve not in FORMATS:
            raise ValueError(f"serve {serve!r} must be one of {sorted(FORMATS)}")
        served = FORMATS[serve]
        observation_spec, action_spec = tuple(observation_spec), tuple(action_spec)
        final, config_path, config = self._plan(model, version, observation_spec, action_spec, max_batch_size,
                                                max_queue_delay_us)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        with warnings.catch_warnings():  # torch deprecates torch.jit; Triton's python backend loads it fine
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
            scripted = script(module, observation_spec)
            probe(scripted, observation_spec, action_spec)
        files = {f.file: f.export(scripted, observation_spec, action_spec)  # the architecture, then what serves it
                 for f in dict.fromkeys((ARCHITECTURE, served))}
        return _stage(final, files, served.wrapper, config_path, config)

    def write_artifact(self, model: str, version: int, format: str, data: bytes, inputs: Sequence[Spec],
                       outputs: Sequence[Spec], *, max_batch_size: int = 64, max_queue_delay_us: int = 100) -> Path:
        """An imported policy file (`format` one of inference_server.formats.FORMATS, `data` its bytes) as
        version `version` of `model`, served as it is: a new model gets its config from `inputs`/`outputs`,
        an existing one must have the same. The file is checked statically (`check_artifact`:
        ValueError naming what does not fit), never run here: load it in Triton and probe it.
        Written beside its final place and renamed into it. Returns the version folder."""
        fmt = format_named(format)
        inputs, outputs = tuple(inputs), tuple(outputs)
        final, config_path, config = self._plan(model, version, inputs, outputs, max_batch_size,
                                                max_queue_delay_us)
        try:
            check_artifact(format, data, inputs, outputs)
        except ArtifactError as exc:
            raise ValueError(f"{format} file for {model!r} v{version}: {exc}") from None
        manifest = json.dumps({"format": format, "file": fmt.file, "size": len(data),
                               "sha256": hashlib.sha256(data).hexdigest()})
        return _stage(final, {fmt.file: data, _ARTIFACT_JSON: manifest.encode()}, fmt.wrapper, config_path, config)

    def imported_format(self, model: str, version: int) -> str | None:
        """The format's name of a version written by `write_artifact` ("torchscript", "onnx"), None otherwise."""
        path = self.root / _check_model_name(model) / str(version) / _ARTIFACT_JSON
        return json.loads(path.read_text())["format"] if path.exists() else None

    def serving_format(self, model: str, version: int) -> str:
        """The name of the format that serves `version` in Triton (`formats.served_in`): "onnx" (onnxruntime:
        `serve="onnx"` or an imported ONNX file) or "torchscript" (torch); FileNotFoundError for a version not
        on disk."""
        folder = self.root / _check_model_name(model) / str(version)
        if not folder.is_dir():
            raise FileNotFoundError(f"version {version} of model {model!r} is not in {self.root}")
        return served_in(folder).name

    def supports_versions_model(self, policy: str) -> bool:
        """True when the newest version of `policy` is in a format that one persistent model serves every
        version of (`write_versions_model` writes it)."""
        versions = self.versions(policy)
        return bool(versions) and bool(format_named(self.serving_format(policy, versions[-1])).versions_model)

    def _plan(self, model: str, version: int, inputs: tuple[Spec, ...], outputs: tuple[Spec, ...],
              max_batch_size: int, max_queue_delay_us: int) -> tuple[Path, Path, str]:
        """Check a new version's arguments; (its final folder, the config path, the config text)."""
        _check_model_name(model)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"version {version!r} must be an integer >= 1")
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size {max_batch_size!r} must be an integer >= 1")
        if not isinstance(max_queue_delay_us, int) or max_queue_delay_us < 0:
            raise ValueError(f"max_queue_delay_us {max_queue_delay_us!r} must be an integer >= 0")
        _check_specs(inputs, outputs)
        final = self.root / model / str(version)
        if final.exists():
            raise FileExistsError(f"version {version} of model {model!r} already exists at {final}")
        config_path = self.root / model / "config.pbtxt"
        if config_path.exists() and _io_block(inputs, outputs) not in config_path.read_text():
            raise ValueError(f"the specs of version {version} differ from the inputs/outputs of "
                             f"the existing versions of {model!r} in {config_path}")
        return final, config_path, _config_text(model, inputs, outputs, max_batch_size, max_queue_delay_us)

    def _refuse_imported(self, model: str, version: int, what: str) -> None:
        fmt = self.imported_format(model, version)
        if fmt is not None:
            raise ValueError(f"version {version} of model {model!r} is an imported {fmt} file: {what} works on "
                             "versions written from a module (its file is only ever run inside Triton)")

    def write_weights(self, model: str, version: int, weights: Mapping[str, torch.Tensor], *,
                      base_version: int | None = None) -> Path:
        """A new version: the TorchScript architecture of `base_version` (default: the newest on
        disk) with `weights` loaded over it, strictly: every name, shape and dtype must match and
        every value be finite (ValueError naming the tensor otherwise). Served like the base version
        (in the format it was written with: `serve`)."""
        _check_model_name(model)
        on_disk = self.versions(model)
        if not on_disk:
            raise FileNotFoundError(f"model {model!r} has no version to take the architecture from")
        base = base_version if base_version is not None else on_disk[-1]
        self._refuse_imported(model, base, "new weights over its architecture")
        final = self.root / model / str(version)
        if final.exists():
            raise FileExistsError(f"version {version} of model {model!r} already exists at {final}")
        with staging_folder(self.root / model, f".v{version}-") as staging:
            self.build_weights(model, weights, base_version=base, into=staging)
            _install(staging, final)
        return final

    def build_weights(self, model: str, weights: Mapping[str, torch.Tensor], *, base_version: int,
                      into: Path) -> None:
        """`write_weights`' version folder built in the empty folder `into` (on this repository's file system),
        not installed: `install(model, version, into)` moves it in. A separate process can build it."""
        import torch
        base = self.root / _check_model_name(model) / str(base_version)
        self._refuse_imported(model, base_version, "new weights over its architecture")
        served = served_in(base)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
            scripted = torch.jit.load(str(base / ARCHITECTURE.file), map_location="cpu")
            check_weights(scripted.state_dict(), weights)
            scripted.load_state_dict(dict(weights), strict=True)
        for fmt in dict.fromkeys((ARCHITECTURE, served)):  # e.g. ONNX: the base's graph with these weights put in
            fmt.reweight(base / fmt.file, scripted, into / fmt.file)
        _install_wrapper(served.wrapper, into)
        os.chmod(into, 0o755)

    def install(self, model: str, version: int, built: Path) -> Path:
        """A folder made by `build_weights` renamed into place as `version`, durably (fsynced)."""
        final = self.root / _check_model_name(model) / str(version)
        if final.exists():
            raise FileExistsError(f"version {version} of model {model!r} already exists at {final}")
        _install(Path(built), final)
        return final

    def state_dict(self, model: str, version: int) -> dict[str, torch.Tensor]:
        """The weights `version` of `model` serves (its TorchScript's state_dict)."""
        import torch
        path = self.root / _check_model_name(model) / str(version) / ARCHITECTURE.file
        if not path.exists():
            raise FileNotFoundError(f"version {version} of model {model!r} is not in {self.root}")
        self._refuse_imported(model, version, "reading its weights")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
            return {k: v.detach().contiguous() for k, v in torch.jit.load(str(path), map_location="cpu")
                    .state_dict().items()}

    def write_versions_model(self, policy: str, *, max_sessions: int = 8) -> str:
        """The persistent model that serves every ONNX version of `policy` from one Triton process, each version
        opened from `root/<policy>/<N>/policy.onnx` at its first request (inference_server/versions_model.py):
        `root/<policy>.versions/`, its config the policy's (inputs, outputs, batching) under its own name. Written
        only when missing or different (atomically, fsynced); returns the model's name. ValueError when `policy`
        has no version in a format served this way (`PolicyFormat.versions_model`: ONNX)."""
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
            raise ValueError(f"max_sessions {max_sessions!r} must be an integer >= 1")
        name = versions_model_name(policy)
        versions = self.versions(policy)
        config_path = self.root / policy / "config.pbtxt"
        if not versions or not config_path.exists():
            raise ValueError(f"policy {policy!r} has no version in {self.root} to serve")
        served = format_named(self.serving_format(policy, versions[-1]))
        if not served.versions_model:
            able = [f for f in FORMATS.values() if f.versions_model]
            raise ValueError(f"policy {policy!r} v{versions[-1]} is served by {served.runtime}, not "
                             f"{' or '.join(f.runtime for f in able)}: only {' or '.join(f.name for f in able)} "
                             "versions are served by a persistent model (write the policy with "
                             f"{' or '.join(f'serve={f.name!r}' for f in able)})")
        lines = [line for line in config_path.read_text().splitlines()
                 if not line.startswith(("name:", "version_policy"))]
        config = "\n".join([f'name: "{name}"', *lines,
                            f'parameters: {{ key: "policy" value: {{ string_value: "{policy}" }} }}',
                            f'parameters: {{ key: "max_sessions" value: {{ string_value: "{max_sessions}" }} }}', ""])
        files = {file: source.read_bytes() for file, source in served.versions_model.items()}
        final = self.root / name
        if (final / "config.pbtxt").exists() and (final / "config.pbtxt").read_text() == config and all(
                (final / "1" / f).exists() and (final / "1" / f).read_bytes() == data for f, data in files.items()):
            return name
        with staging_folder(self.root, f".{name}-") as staging:
            (staging / "1").mkdir()
            for file, data in files.items():
                (staging / "1" / file).write_bytes(data)
                py_compile.compile(str(staging / "1" / file), doraise=True,  # no __pycache__ written by Triton
                                   cfile=importlib.util.cache_from_source(str(staging / "1" / file)))
            (staging / "config.pbtxt").write_text(config)
            os.chmod(staging, 0o755)
            if final.exists():  # a changed one: the old folder moved aside, then removed
                old = Path(tempfile.mkdtemp(prefix=f".{name}-old-", dir=self.root))
                os.rename(final, old / name)
                shutil.rmtree(old, ignore_errors=True)
            _install(staging, final)
        return name

    def retired_versions(self, model: str) -> list[int]:
        """Versions moved out by `retire` (their numbers are never reused)."""
        folder = self.root / ".retired" / _check_model_name(model)
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []

    def retire(self, model: str, version: int) -> None:
        """Move a version folder out of the model (under root/.retired) so that the next
        `load_model` unloads it; its files stay for audit."""
        source = self.root / _check_model_name(model) / str(version)
        target = self.root / ".retired" / model / str(version)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(source, target)
        fsync_dir(source.parent)
        fsync_dir(target.parent)


def check_weights(expected: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor]) -> None:
    """ValueError naming the first tensor that is missing, unexpected, misshapen, of another dtype,
    or not finite.

    >>> import torch
    >>> w = {"w": torch.zeros(2)}
    >>> check_weights(w, {"w": torch.tensor([0.0, float("nan")])})
    Traceback (most recent call last):
    ...
    ValueError: weight 'w' has non-finite values
    """
    import torch
    missing = sorted(expected.keys() - weights.keys())
    unexpected = sorted(weights.keys() - expected.keys())
    if missing or unexpected:
        raise ValueError(f"weights do not match the architecture: missing {missing}, unexpected {unexpected}")
    for name, want in expected.items():
        got = weights[name]
        if tuple(got.shape) != tuple(want.shape):
            raise ValueError(f"weight {name!r} has shape {list(got.shape)}, the architecture {list(want.shape)}")
        if got.dtype != want.dtype:
            raise ValueError(f"weight {name!r} has dtype {got.dtype}, the architecture {want.dtype}")
        if got.is_floating_point() and not bool(torch.isfinite(got).all()):
            raise ValueError(f"weight {name!r} has non-finite values")


def _check_model_name(model: str) -> str:
    if not isinstance(model, str) or not _NAME.fullmatch(model) or ".." in model:
        raise ValueError(f"model name {model!r} must match {_NAME.pattern}")
    if model.endswith(VERSIONS_SUFFIX):
        raise ValueError(f"model name {model!r} ends with {VERSIONS_SUFFIX!r}: that name is reserved for the "
                         f"persistent model serving the versions of policy {model.removesuffix(VERSIONS_SUFFIX)!r} "
                         "(gateway --persistent-versions); choose another name")
    return model


def versions_model_name(policy: str) -> str:
    """The Triton model that serves every version of `policy` from one process (`write_versions_model`).

    >>> versions_model_name("pendulum")
    'pendulum.versions'
    """
    return _check_model_name(policy) + VERSIONS_SUFFIX


def _check_specs(observation_spec: tuple[Spec, ...], action_spec: tuple[Spec, ...]) -> None:
    if not observation_spec:
        raise ValueError("observation_spec is empty: a policy needs at least one input")
    if not action_spec:
        raise ValueError("action_spec is empty: a policy needs at least one output")
    seen: set[str] = set()
    for spec in observation_spec + action_spec:
        if not isinstance(spec, Spec):
            raise TypeError(f"spec {spec!r} must be a protos.codec.Spec")
        if not _TENSOR_NAME.fullmatch(spec.name):
            raise ValueError(f"tensor name {spec.name!r} must match {_TENSOR_NAME.pattern}")
        if spec.name in seen:
            raise ValueError(f"tensor name {spec.name!r} is used twice in the observation/action specs")
        if not spec.shape:
            raise ValueError(f"tensor {spec.name!r} has an empty shape: use shape (1,) for a scalar")
        if 0 in spec.shape:
            raise ValueError(f"tensor {spec.name!r} has a zero dimension in shape {list(spec.shape)}")
        seen.add(spec.name)


def _io_block(observation_spec: tuple[Spec, ...], action_spec: tuple[Spec, ...]) -> str:
    def entries(specs: tuple[Spec, ...]) -> str:
        return ",\n".join(f'  {{ name: "{s.name}" data_type: TYPE_{triton_dtype(dtype_to_proto(s.dtype))} '
                          f'dims: [ {", ".join(map(str, s.shape))} ] }}' for s in specs)

    return f"input [\n{entries(observation_spec)}\n]\noutput [\n{entries(action_spec)}\n]\n"


def _config_text(model: str, observation_spec: tuple[Spec, ...], action_spec: tuple[Spec, ...],
                 max_batch_size: int, max_queue_delay_us: int) -> str:
    return (f'name: "{model}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
            f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}\n"
            "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
            "version_policy: { all { } }\n" + _io_block(observation_spec, action_spec))


def _install_wrapper(source: Path, folder: Path) -> None:
    """model.py and its bytecode. Triton's python stub would otherwise write <version>/__pycache__
    after loading it (it ignores PYTHONDONTWRITEBYTECODE), Triton would see that version as
    modified and reload it, a second stub and torch imported again, at the next load_model."""
    shutil.copyfile(source, folder / "model.py")
    py_compile.compile(str(folder / "model.py"), cfile=importlib.util.cache_from_source(str(folder / "model.py")),
                       doraise=True)


def _stage(final: Path, files: Mapping[str, bytes], wrapper: Path, config_path: Path, config: str) -> Path:
    """A new version folder: `files` and the `wrapper` model.py written beside `final`, the model's config
    (re)written when it changed, then the folder installed as `final`."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with staging_folder(final.parent, f".v{final.name}-") as staging:
        for name, data in files.items():
            (staging / name).write_bytes(data)
        _install_wrapper(wrapper, staging)
        os.chmod(staging, 0o755)
        if not config_path.exists() or config_path.read_text() != config:
            write_text(config_path, config)  # bridge.common.files: atomic, fsynced; an unchanged config is left
        _install(staging, final)
    return final


@contextlib.contextmanager
def staging_folder(parent: Path, prefix: str) -> Iterator[Path]:
    """A new folder in `parent` to build a folder in before it is renamed into place; removed if the block fails."""
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _install(staging: Path, final: Path) -> None:
    """A finished staging folder into its final place, durably: its files and itself fsynced, renamed,
    then the model folder fsynced (the rename survives a power cut)."""
    fsync_tree(staging)
    os.rename(staging, final)
    fsync_dir(final.parent)
    fsync_dir(final.parent.parent)  # a new model's folder


def fsync_tree(folder: Path) -> None:
    """fsync every file under `folder`, then every folder (deepest first), `folder` last."""
    folders = []
    for here, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(here, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        folders.append(here)
    for here in reversed(folders):
        fsync_dir(Path(here))
