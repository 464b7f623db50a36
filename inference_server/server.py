"""Start and stop a real `tritonserver` (the binary inside the nvidia-pytriton wheel).

The server runs in its own process group with explicit model control on loopback ports, its
python backend in a per-server temporary folder; `stop()` (or leaving the `with` block) sends
tritonserver SIGTERM and SIGKILL to whatever is left of its group, so no backend stub outlives it
(bridge.common.processes.stop_group).
Usage (plain text: starting Triton takes seconds):

    with TritonServer(repo.root, models=["policy"]) as server:
        client = PolicyClient(server.grpc_url)
        ...                                   # write version 2, then:
        server.load_model("policy")           # serves versions 1 and 2

With `secret` (a shared secret, `inference_server.secret`) every Triton endpoint, health included, answers
only requests that carry it (`PolicyClient(url, secret=...)`); others get Triton's refusal, e.g. over gRPC
"This protocol is restricted, expecting header 'triton-grpc-protocol-tether-triton-key'":

    with TritonServer(repo.root, models=["policy"], host="198.18.0.3", secret=read_secret(path)) as server:
        client = PolicyClient(server.grpc_url, secret=server.secret)

tritonserver takes the secret only on its command line (it reads no option file): other local users can
read it in /proc/PID/cmdline unless /proc is mounted `hidepid=2` or Triton runs in a container of its own
(docs/security.md). Our errors and log excerpts show it as `***`.

Failures to start are `TritonStartError`s carrying the end of Triton's log:

    >>> TritonServer("/nonexistent/repository").start()
    Traceback (most recent call last):
    ...
    inference_server.server.TritonStartError: model repository /nonexistent/repository is not a folder
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path

from bridge.common.lifecycle import Started
from bridge.common.processes import NotReady, free_port, spawn, stop_group, wait_ready
from inference_server.secret import CATEGORIES, KEY, check_secret, grpc_headers, http_headers, redact

_EXIT_TIMEOUT_S = 1  # Triton's own grace after SIGTERM; a python-backend model takes ~2 s to unload
_STOP_GRACE_S = 15.0  # ours, before SIGKILL
_LOG_TAIL_CHARS = 3000


class TritonStartError(RuntimeError):
    """Triton could not start: binary missing, process exited, or not ready in time."""


class ModelControlError(RuntimeError):
    """Triton refused or failed to load/unload a model; the message names server and model."""


def pytriton_root() -> Path:
    """The `pytriton/tritonserver` folder of the installed nvidia-pytriton wheel."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonStartError("nvidia-pytriton is not installed: no tritonserver binary")
    return Path(next(iter(spec.submodule_search_locations))) / "tritonserver"


def triton_binary() -> Path:
    """Path of the `tritonserver` executable; `TritonStartError` if it is missing."""
    binary = pytriton_root() / "bin" / "tritonserver"
    if not os.access(binary, os.X_OK):
        raise TritonStartError(f"tritonserver binary not found (or not executable) at {binary}")
    return binary


def build_backend_dir(folder: Path) -> Path:
    """Create `folder/python/` with the python backend and the stub for this interpreter.

    Triton wants `<backend dir>/python/{libtriton_python.so, triton_python_backend_utils.py,
    triton_python_backend_stub}`; the wheel keeps the stubs per Python version apart.
    """
    root = pytriton_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    sources = {
        "libtriton_python.so": root / "backends" / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": root / "backends" / "python" / "triton_python_backend_utils.py",
        "triton_python_backend_stub": root / "python_backend_stubs" / version / "triton_python_backend_stub",
    }
    python = Path(folder) / "python"
    python.mkdir(parents=True, exist_ok=True)
    for name, source in sources.items():
        if not source.exists():
            raise TritonStartError(f"python backend file {source} missing (Python {version} unsupported?)")
        link = python / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(source)
    return Path(folder)


def triton_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver: our libpython first, and the venv's python on PATH.

    The stub embeds libpython3.X: LD_LIBRARY_PATH must find this interpreter's (not the
    distribution's), and the stub's python finds the venv's site-packages through PATH.
    """
    env = dict(os.environ if base is None else base)
    wheel_libs = pytriton_root().parent.parent / "nvidia_pytriton.libs"
    libs = [sysconfig.get_config_var("LIBDIR") or "", str(wheel_libs)]
    libs += [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    env["LD_LIBRARY_PATH"] = ":".join(p for p in libs if p)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)])
    return env


class TritonServer(Started):
    """One `tritonserver` subprocess serving `repository` with explicit model control."""

    def __init__(self, repository: Path | str, *, host: str = "127.0.0.1", grpc_port: int | None = None,
                 http_port: int | None = None, models: Sequence[str] = (), log_path: Path | None = None,
                 secret: str | None = None):
        """`host`: the address both endpoints bind (loopback by default). `secret`: restrict every endpoint to
        requests carrying it (see the module docstring). Started on the main thread, tritonserver gets SIGTERM from
        the kernel should this process be killed (bridge.common.processes)."""
        if isinstance(models, str):
            raise TypeError(f"models must be a sequence of names, got the string {models!r}")
        self.repository = Path(repository)
        self.host = host
        self.grpc_port = grpc_port if grpc_port is not None else free_port(host)
        self.http_port = http_port if http_port is not None else free_port(host)
        while self.http_port == self.grpc_port:
            self.http_port = free_port(host)
        self.models = tuple(models)
        self.log_path = Path(log_path) if log_path is not None else None
        self.secret = check_secret(secret, where="TritonServer(secret=...)") if secret is not None else None
        self._proc: subprocess.Popen | None = None
        self._workdir: Path | None = None
        self._finalizer: weakref.finalize | None = None
        self._version: str | None = None
        self._shm_prefix = ""

    grpc_url = property(lambda self: f"{self.host}:{self.grpc_port}")
    http_url = property(lambda self: f"http://{self.host}:{self.http_port}")
    pid = property(lambda self: self._proc.pid if self._proc is not None else None)

    @property
    def version(self) -> str:
        """Triton's version string (e.g. "2.51.0"), read from the server metadata by `start()`."""
        if self._version is None:
            raise RuntimeError(f"Triton on {self.grpc_url} has not been started")
        return self._version

    def __repr__(self) -> str:  # never the secret
        return (f"TritonServer({str(self.repository)!r}, grpc {self.grpc_url}, http {self.http_url}"
                f"{', restricted' if self.secret else ''})")

    def start(self, timeout: float = 60.0) -> None:
        """Start tritonserver and block until `/v2/health/ready` answers 200 (models loaded)."""
        if self._proc is not None:
            raise TritonStartError(f"Triton already running (pid {self._proc.pid}) on {self.grpc_url}")
        binary = triton_binary()
        if not self.repository.is_dir():
            raise TritonStartError(f"model repository {self.repository} is not a folder")
        self._workdir = Path(tempfile.mkdtemp(prefix="tether-triton-"))
        self._shm_prefix = f"{self._workdir.name}_"  # unique: lets stop() remove what a killed stub left
        backends = build_backend_dir(self._workdir / "backends")
        if self.log_path is None:
            self.log_path = self._workdir / "tritonserver.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        args = [str(binary), f"--model-repository={self.repository.resolve()}",
                f"--backend-directory={backends}", "--model-control-mode=explicit",
                *[f"--load-model={m}" for m in self.models], "--disable-auto-complete-config",
                f"--http-address={self.host}", f"--grpc-address={self.host}",
                f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}",
                "--allow-metrics=false", f"--exit-timeout-secs={_EXIT_TIMEOUT_S}",
                f"--backend-config=python,shm-region-prefix-name={self._shm_prefix}"]
        if self.secret:  # every protocol group, both endpoints: without the header nothing answers
            args += [f"--grpc-restricted-protocol={','.join(CATEGORIES)}:{KEY}={self.secret}",
                     f"--http-restricted-api={','.join(CATEGORIES)}:{KEY}={self.secret}"]
        with open(self.log_path, "ab") as log:
            self._proc = spawn(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=triton_env())
        self._finalizer = weakref.finalize(self, _cleanup, self._proc, self._workdir, self._shm_prefix)
        try:
            wait_ready(self._proc, self._ready, timeout=timeout, what="tritonserver")
        except NotReady as exc:
            self._fail(str(exc) if exc.exit_code is not None
                       else f"tritonserver not ready on {self.http_url} after {timeout:g} s")
        except BaseException:  # e.g. Ctrl-C or SIGTERM (bridge.common.processes.Terminated) while it starts
            self.stop()
            raise
        try:
            with urllib.request.urlopen(self._request("/v2"), timeout=5) as response:
                self._version = str(json.load(response)["version"])
        except (OSError, ValueError, KeyError) as exc:
            self._fail(f"tritonserver metadata unreadable on {self.http_url}/v2: {exc}")

    def exited(self) -> int | None:
        """tritonserver's exit status once it has ended by itself (-11: a crash), None while it runs or when stopped."""
        return self._proc.poll() if self._proc is not None else None

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(self._request("/v2/health/ready"), timeout=1) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def _request(self, path: str) -> urllib.request.Request:
        return urllib.request.Request(f"{self.http_url}{path}", headers=http_headers(self.secret))

    def _fail(self, reason: str) -> None:
        where = f"grpc {self.grpc_url}, http {self.http_url}"
        user_log = self.log_path is not None and self._workdir is not None \
            and not self.log_path.is_relative_to(self._workdir)
        if user_log:
            where += f", log {self.log_path}"
        summary = self.log_summary()
        self.stop()
        raise TritonStartError(f"{reason} ({where}); Triton's log says:\n{summary}")

    def log_summary(self, *, lines: int = 6) -> str:
        """Triton's error lines, then the last `lines` lines of its log without the options table."""
        size = self.log_path.stat().st_size if self.log_path is not None and self.log_path.exists() else 0
        text = self.log_tail(1 << 16).splitlines()[1 if size > 1 << 16 else 0:]  # a cut first line goes
        errors = [line for line in text
                  if line.startswith(("E", "error:")) and "CudaDriverHelper" not in line]  # no-GPU noise
        kept = [line.rstrip() for line in text if line.strip() and not line.lstrip().startswith(("|", "+-"))]
        tail = [line for line in kept[-lines:] if line not in errors]
        return "\n".join(errors[-12:] + (["..."] if tail else []) + tail)

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        """The last `chars` characters of Triton's log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - chars))
            return redact(f.read().decode(errors="replace"), self.secret)

    def stop(self) -> None:
        """SIGTERM the server, SIGKILL to its process group after a grace period; idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # runs _cleanup once
            self._finalizer = None
        self._proc = self._version = None
        if self._workdir is not None and self.log_path is not None \
                and self.log_path.is_relative_to(self._workdir):
            self.log_path = None  # the log lived in the removed work folder
        self._workdir = None

    def load_model(self, name: str, *, timeout: float = 60.0) -> None:
        """Load (or reload, picking up new version folders) `name`; blocks until it is served."""
        self._control("load", name, timeout)

    def unload_model(self, name: str, *, timeout: float = 60.0) -> None:
        self._control("unload", name, timeout)

    def _control(self, action: str, name: str, timeout: float) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        if self._proc is None:
            raise ModelControlError(f"cannot {action} {name!r}: Triton is not running")
        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            getattr(client, f"{action}_model")(name, headers=grpc_headers(self.secret), client_timeout=timeout)
        except InferenceServerException as exc:
            raise ModelControlError(f"{action} of model {name!r} on {self.grpc_url} failed: "
                                    f"{redact(exc.message(), self.secret)}\n"
                                    f"{self.log_tail(1500)}") from None
        finally:
            client.close()


def _cleanup(proc: subprocess.Popen, workdir: Path, shm_prefix: str) -> None:
    """Stop `proc` and every process of its group (the backend stubs), then remove `workdir`
    and the python backend's shared memory regions (left behind when a stub is killed)."""
    stop_group(proc, grace_s=_STOP_GRACE_S)
    shutil.rmtree(workdir, ignore_errors=True)
    for region in Path("/dev/shm").glob(f"{shm_prefix}*"):
        region.unlink(missing_ok=True)
