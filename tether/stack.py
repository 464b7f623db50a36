"""The real stack on free loopback ports, started and stopped as one: a `tritonserver` over a model
repository and a `tether gateway` subprocess in front of it (what `tether eval`, the pytest plugin
`tether.testing` and the demo topology run on).

    with Stack(tmp_dir, envs=["InvertedPendulum-v5"]) as stack:   # a fresh MLP per env, served as v1
        stack.gateway                     # "127.0.0.1:PORT": point sims, `tether sim`, `tether eval` here
        stack.triton_url                  # "127.0.0.1:PORT"
        version = stack.import_policy(Path("walker.onnx"), name="walker")   # `tether policy import`'s path
        stats = asyncio.run(run_sessions(stack.gateway, make_env, envs=4, episodes=8, **stack.sim_kwargs()))

Secured: `Stack(tmp_dir, envs=[...], secure=True)` makes a lab CA (`tether certs init`), serves gRPC
over TLS and checks tokens; `stack.ca` and `stack.token` (an operator token NAME.SECRET) are what a
client needs, `stack.client_flags()` the same as command-line flags.

The gateway is a subprocess, not a task in the caller's event loop: it is what a CI job runs, its
event loop never competes with the test's, and a hung or crashed gateway cannot take the caller
with it. Both processes lead their own process group; `close()` (idempotent, also run by a
finalizer at interpreter exit and when `start()` fails half-way) stops each group, SIGKILL after a
grace period, so nothing outlives the stack. A caller SIGKILLed itself cannot clean up: Triton and
the gateway then get SIGTERM from the kernel (PR_SET_PDEATHSIG, when the stack was started on the
main thread: the signal follows the thread that started them).

`GatewayProcess` and `stop_process` are the process pieces the demo topology (tether.topology),
benchmarks and tests share.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

from bridge.common.processes import parent_death_signal
from inference_server.server import group_members

__all__ = ["GatewayProcess", "Stack", "StackError", "gateway_process", "stop_process"]


class StackError(RuntimeError):
    """A part of the stack did not start or refused a request; the message names it and where its log is."""


def stop_process(proc: subprocess.Popen, *, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; returns once the process is gone. A process leading its own
    process group (started with start_new_session) takes whatever of its group is left with it."""
    leads_group = _pgid(proc.pid) == proc.pid
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if leads_group:
        deadline = time.monotonic() + 5.0
        while group_members(proc.pid) and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(0.02)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


class GatewayProcess:
    """`tether gateway` as a subprocess on a loopback port (0 = a free one), in its own process group.

        gw = GatewayProcess(triton_url=triton.grpc_url, policy="hopper_v5", log_path=run_dir / "gateway.log")
        address = gw.start()    # "127.0.0.1:PORT", once the gateway says it listens
        ...
        gw.stop()               # SIGTERM (the gateway drains), SIGKILL after 10 s; idempotent

    Its output goes to `log_path`. StackError with the log's end when it does not start in `timeout` s.
    """

    def __init__(self, *, triton_url: str, policy: str, log_path: Path, extra_args: Sequence[str] = (),
                 port: int = 0, timeout: float = 30.0, die_with_parent: bool = False):
        if isinstance(extra_args, str):
            raise TypeError(f"extra_args must be a sequence of arguments, got the string {extra_args!r}")
        self.cmd = [sys.executable, "-m", "tether", "gateway", "--triton", triton_url, "--policy", policy,
                    "--port", str(port), *extra_args]
        self.log_path, self.timeout, self.die_with_parent = Path(log_path), timeout, die_with_parent
        self.address: str | None = None
        self.proc: subprocess.Popen | None = None
        self._finalizer: weakref.finalize | None = None

    pid = property(lambda self: self.proc.pid if self.proc is not None else None)

    def __enter__(self) -> GatewayProcess:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> str:
        if self.proc is not None:
            raise StackError(f"gateway already started (pid {self.proc.pid})")
        log = open(self.log_path, "a")  # noqa: SIM115 - closed by _stop, after the process
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                                     preexec_fn=parent_death_signal() if self.die_with_parent else None)
        address: list[str] = []
        ready = threading.Event()

        def pump() -> None:  # the first line tells the address; the rest goes to the log
            for line in self.proc.stdout:
                if not address and line.startswith("gateway listening on "):
                    address.append(line.split()[-1])
                    ready.set()
                log.write(line)
                log.flush()
            ready.set()

        pumping = threading.Thread(target=pump, daemon=True, name="gateway-log")
        pumping.start()
        self._finalizer = weakref.finalize(self, _stop, self.proc, pumping, log)
        ready.wait(self.timeout)
        if not address:
            self.stop()
            raise StackError(f"gateway did not start within {self.timeout:g} s; see {self.log_path}:\n"
                             + self.log_path.read_text()[-2000:])
        self.address = address[0]
        return self.address

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # runs _stop once
            self._finalizer = None


def _stop(proc: subprocess.Popen, pumping: threading.Thread, log) -> None:
    stop_process(proc)
    pumping.join(5)
    log.close()


@contextlib.contextmanager
def gateway_process(*, triton_url: str, policy: str, log_path: Path, timeout: float = 30.0,
                    extra_args: tuple[str, ...] = (), port: int = 0) -> Iterator[str]:
    """Start `tether gateway` on a loopback port (0 = a free one); yields its address, stops it on exit."""
    with GatewayProcess(triton_url=triton_url, policy=policy, log_path=log_path, extra_args=extra_args, port=port,
                        timeout=timeout) as gateway:
        yield gateway.address


class Stack:
    """tritonserver + a `tether gateway` subprocess on free loopback ports, under `directory`:
    `models/` (the model repository, with its registry in models/.tether/), `triton.log`,
    `gateway.log`, and with `secure` `certs/` and `tokens.json`.

    `envs`: a freshly initialised policy per env (named `tether.topology.policy_name(env)`, e.g.
    `invertedpendulum_v5`), served as v1 (`stochastic`: a Gaussian policy, as PPO trains). `models`:
    more models already in `directory/models` to load. `policy`: the gateway's default policy (default:
    the first of those). `deadline_ms`: the gateway's per-step inference deadline (None: its default,
    100 ms, a robot's; a loaded CI runner stalls longer). `gateway_args`: more `tether gateway` flags
    (`--gate-eval-env ...`). `timeout_s`: for each process to be ready. `persistent_versions`: the default policy's
    ONNX versions served by one persistent Triton model (`tether gateway --persistent-versions`, docs/versions.md);
    None: on for a `stochastic` env policy (the learning loop's, served by onnxruntime).
    """

    def __init__(self, directory: Path | str, *, envs: Sequence[str] = (), models: Sequence[str] = (),
                 policy: str | None = None, secure: bool = False, deadline_ms: int | None = None,
                 gateway_args: Sequence[str] = (), seed: int = 0, stochastic: bool = False, timeout_s: float = 120.0,
                 persistent_versions: bool | None = None):
        for what, value in (("envs", envs), ("models", models), ("gateway_args", gateway_args)):
            if isinstance(value, str):
                raise TypeError(f"{what} must be a sequence, got the string {value!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if deadline_ms is not None and deadline_ms <= 0:
            raise ValueError(f"deadline_ms must be positive, got {deadline_ms}")
        self.directory = Path(directory)
        self.envs, self.models, self.policy = tuple(envs), tuple(models), policy
        self.secure, self.deadline_ms, self.gateway_args = secure, deadline_ms, tuple(gateway_args)
        self.seed, self.stochastic = seed, stochastic
        self.persistent_versions = persistent_versions
        self.timeout_s = timeout_s
        self.triton = None  # inference_server.TritonServer once started
        self._gateway: GatewayProcess | None = None
        self.ca: Path | None = None
        self.token: str | None = None        # operator: sessions, imports, e-stops
        self.robot_token: str | None = None  # robot: sessions only
        self._exit = contextlib.ExitStack()
        self._finalizer = weakref.finalize(self, self._exit.close)

    # -- addresses ----------------------------------------------------------------------------------

    @property
    def gateway(self) -> str:
        """The gateway's gRPC address HOST:PORT."""
        if self._gateway is None or self._gateway.address is None:
            raise StackError("the stack is not started: use `with Stack(...) as stack` or stack.start()")
        return self._gateway.address

    @property
    def triton_url(self) -> str:
        if self.triton is None:
            raise StackError("the stack is not started: use `with Stack(...) as stack` or stack.start()")
        return self.triton.grpc_url

    @property
    def repository(self):
        """The model repository (inference_server.ModelRepository) Triton serves."""
        from inference_server import ModelRepository

        return ModelRepository(self.directory / "models")

    @property
    def pids(self) -> dict[str, int]:
        """The process (and process group) ids it started: {"triton": pid, "gateway": pid} (Triton's only
        while it runs): for checking that none is left, e.g. with inference_server.server.group_members."""
        out = {}
        if self.triton is not None and self.triton.pid is not None:
            out["triton"] = self.triton.pid
        if self._gateway is not None and self._gateway.pid is not None:
            out["gateway"] = self._gateway.pid
        return out

    # -- life cycle ---------------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> Stack:
        """Start Triton, then the gateway; on any failure stop what started and raise (StackError,
        inference_server.TritonStartError)."""
        from inference_server import TritonServer

        if self.triton is not None:
            raise StackError(f"stack already started (gateway {self._gateway and self._gateway.address})")
        try:
            repo = self.repository
            repo.root.mkdir(parents=True, exist_ok=True)
            names = []
            if self.envs:  # (tether.topology imports torch and the sims: not for a bare stack)
                from tether.topology import write_initial_policy

                names = [write_initial_policy(repo, env, seed=self.seed, stochastic=self.stochastic)
                         for env in self.envs]
            names += [m for m in self.models if m not in names]
            default = self.policy or next(iter(names), "")
            loaded, args = list(names), ["--model-repository", str(repo.root), *self._security_args()]
            persistent = self.persistent_versions
            if persistent is None:  # the learning loop's (stochastic) policies, when served by onnxruntime
                persistent = self.stochastic and default in names[:len(self.envs)] and \
                    repo.serving_format(default, repo.versions(default)[-1]) == "onnx"
            if persistent and default in names:  # the default policy's versions from one model
                loaded[names.index(default)] = repo.write_versions_model(default)
                args.append("--persistent-versions")
            main_thread = threading.current_thread() is threading.main_thread()  # PDEATHSIG follows the thread
            self.triton = TritonServer(repo.root, models=loaded, log_path=self.directory / "triton.log",
                                       die_with_parent=main_thread)
            self._exit.callback(self.triton.stop)
            self.triton.start(timeout=self.timeout_s)
            if self.deadline_ms is not None:
                args += ["--deadline-ms", str(self.deadline_ms)]
            args += self.gateway_args  # last: the caller's flags win
            self._gateway = GatewayProcess(triton_url=self.triton.grpc_url, policy=default,
                                           log_path=self.directory / "gateway.log", extra_args=args,
                                           timeout=self.timeout_s, die_with_parent=main_thread)
            self._exit.callback(self._gateway.stop)
            self._gateway.start()
        except BaseException:
            self.close()
            raise
        return self

    def restart_gateway(self) -> str:
        """Stop the gateway (SIGTERM: it drains) and start it again with the same flags and log, Triton kept: it
        starts from what the old one kept on disk (registry, experience log). Returns its new address."""
        old = self._gateway
        if old is None or old.proc is None:
            raise StackError("the stack is not started: use `with Stack(...) as stack` or stack.start()")
        old.stop()
        new = GatewayProcess(triton_url=self.triton_url, policy="", log_path=old.log_path, timeout=old.timeout,
                             die_with_parent=old.die_with_parent)
        new.cmd = list(old.cmd)  # the same command line (its --port 0: a fresh port)
        self._gateway = new
        self._exit.callback(new.stop)
        new.start()
        return new.address

    def close(self) -> None:
        """Stop the gateway, then Triton (each process group; SIGKILL after a grace period). Idempotent."""
        self._exit.close()

    def _security_args(self) -> list[str]:
        if not self.secure:
            return []
        from bridge.security.certs import init_certs
        from bridge.security.tokens import TokenStore

        certs = self.directory / "certs"
        if not (certs / "ca.key").exists():
            init_certs(certs)
        self.ca = certs / "ca.crt"
        tokens = TokenStore(self.directory / "tokens.json")
        for name, role in (("ci", "operator"), ("sim", "robot")):
            token = tokens.add(name, role=role, replace=True)
            if role == "operator":
                self.token = token
            else:
                self.robot_token = token
        return ["--tls-cert", str(certs / "server.crt"), "--tls-key", str(certs / "server.key"),
                "--tokens", str(tokens.path), "--gate-tls-ca", str(self.ca)]

    # -- what clients need --------------------------------------------------------------------------

    def sim_kwargs(self) -> dict:
        """`tls` and `token` for sim.client.run_sessions / run_vector_sessions (empty when not secure)."""
        if not self.secure:
            return {}
        from sim.client import ClientTls

        return {"tls": ClientTls(ca=self.ca), "token": self.token}

    def credentials(self) -> dict:
        """`ca` and `token` for tether.policy_cli.publish and bridge.security.channel (empty when not secure)."""
        return {"ca": self.ca, "token": self.token} if self.secure else {}

    def client_flags(self) -> list[str]:
        """`--gateway HOST:PORT` and, when secure, `--tls-ca` and `--token`: for `tether sim/status/eval ...`."""
        flags = ["--gateway", self.gateway]
        if self.secure:
            flags += ["--tls-ca", str(self.ca), "--token", self.token]
        return flags

    def import_policy(self, path: Path | str, *, name: str, format: str | None = None, obs: Sequence[str] = (),
                      action: Sequence[str] = (), timeout_s: float = 300.0) -> int:
        """`tether policy import PATH --policy NAME` against this stack's gateway: the file (TorchScript or
        ONNX; specs from the file or `obs`/`action` as NAME:DTYPE:SHAPE[:LOW:HIGH]) is probed here, sent,
        gated and served. Returns the new version. ArtifactError for a bad file; StackError naming the
        gateway's reason when it refuses."""
        from tether.policy_cli import ImportRefused, import_policy_file

        try:
            _, reply = import_policy_file(self.gateway, Path(path), name=name, format=format, obs=obs, action=action,
                                       timeout_s=timeout_s, **self.credentials())
        except ImportRefused as exc:
            raise StackError(f"{exc}; see {self.directory / 'gateway.log'}") from None
        return reply.version
