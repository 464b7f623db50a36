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
the gateway then get SIGTERM from the kernel (bridge.common.processes: when the stack was started
on the main thread, as the signal follows the thread that started them).

`GatewayProcess` is the gateway piece the demo topology (tether.topology), the cluster, benchmarks
and tests share.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bridge.common.processes import Child, NotReady

if TYPE_CHECKING:
    from bridge.client import Credentials

__all__ = ["GatewayProcess", "Stack", "StackError", "gateway_process"]


class StackError(RuntimeError):
    """A part of the stack did not start or refused a request; the message names it and where its log is."""


class GatewayProcess(Child):
    """`tether gateway` as a subprocess on a loopback port (0 = a free one), in its own process group.

        gw = GatewayProcess(triton_url=triton.grpc_url, policy="hopper_v5", log_path=run_dir / "gateway.log")
        address = gw.start()    # "127.0.0.1:PORT", once the gateway says it listens
        ...
        gw.stop()               # SIGTERM (the gateway drains), SIGKILL after 10 s; idempotent

    Its output goes to `log_path`. StackError with the log's end when it does not start in `timeout` s.
    """

    def __init__(self, *, triton_url: str, policy: str, log_path: Path, extra_args: Sequence[str] = (),
                 port: int = 0, timeout: float = 30.0):
        if isinstance(extra_args, str):
            raise TypeError(f"extra_args must be a sequence of arguments, got the string {extra_args!r}")
        super().__init__([sys.executable, "-m", "tether", "gateway", "--triton", triton_url, "--policy", policy,
                          "--port", str(port), *extra_args], log_path, name="gateway",
                         ready="gateway listening on ", timeout=timeout)

    address = property(lambda self: self.ready_value)

    def start(self) -> str:
        if self.proc is not None:
            raise StackError(f"gateway already started (pid {self.proc.pid})")
        try:
            return super().start()
        except NotReady as exc:
            raise StackError(str(exc)) from None


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

    `envs`: a freshly initialised policy per env (named `tether.initial_policy.policy_name(env)`, e.g.
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
        while it runs): for checking that none is left, e.g. with bridge.common.processes.group_members."""
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
            if self.envs:  # (tether.initial_policy imports torch and the sims: not for a bare stack)
                from tether.initial_policy import write_initial_policy

                names = [write_initial_policy(repo, env, seed=self.seed, stochastic=self.stochastic)
                         for env in self.envs]
            names += [m for m in self.models if m not in names]
            default = self.policy or next(iter(names), "")
            loaded, args = list(names), ["--model-repository", str(repo.root), *self._security_args()]
            persistent = self.persistent_versions
            if persistent is None:  # the learning loop's (stochastic) policies, when served by onnxruntime
                persistent = self.stochastic and default in names[:len(self.envs)] and \
                    repo.supports_versions_model(default)
            if persistent and default in names:  # the default policy's versions from one model
                loaded[names.index(default)] = repo.write_versions_model(default)
                args.append("--persistent-versions")
            self.triton = TritonServer(repo.root, models=loaded, log_path=self.directory / "triton.log")
            self._exit.callback(self.triton.stop)
            self.triton.start(timeout=self.timeout_s)
            if self.deadline_ms is not None:
                args += ["--deadline-ms", str(self.deadline_ms)]
            args += self.gateway_args  # last: the caller's flags win
            self._gateway = GatewayProcess(triton_url=self.triton.grpc_url, policy=default,
                                           log_path=self.directory / "gateway.log", extra_args=args,
                                           timeout=self.timeout_s)
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
        new = GatewayProcess(triton_url=self.triton_url, policy="", log_path=old.log_path, timeout=old.timeout)
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
        self.token = tokens.add("ci", role="operator", replace=True)
        self.robot_token = tokens.add("sim", role="robot", replace=True)
        return ["--tls-cert", str(certs / "server.crt"), "--tls-key", str(certs / "server.key"),
                "--tokens", str(tokens.path), "--gate-tls-ca", str(self.ca)]

    # -- what clients need --------------------------------------------------------------------------

    def sim_kwargs(self) -> dict:
        """`tls` and `token` for sim.client.run_sessions / run_vector_sessions (empty when not secure)."""
        if not self.secure:
            return {}
        from sim.client import ClientTls

        return {"tls": ClientTls(ca=self.ca), "token": self.token}

    def credentials(self) -> Credentials:
        """The CA and token clients of this stack's gateway need (none when not secure)."""
        from bridge.client import Credentials

        return Credentials(ca=self.ca, token=self.token) if self.secure else Credentials()

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
                                       timeout_s=timeout_s, credentials=self.credentials())
        except ImportRefused as exc:
            raise StackError(f"{exc}; see {self.directory / 'gateway.log'}") from None
        return reply.version
