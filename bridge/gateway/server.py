"""The gateway process: a `grpc.aio` server for `tether.v1.Bridge` plus the standard gRPC health
service, in front of a Triton server.

    gateway = Gateway(GatewayConfig(triton_url="127.0.0.1:8001", policy="hopper",
                                    model_repository=Path("run/models"),     # to publish versions
                                    experience_dir=Path("run/experience"),   # to log transitions
                                    rewards={"hopper": Path("hopper.yaml")}))
    await gateway.start()          # waits for Triton, then serves; gateway.address is HOST:PORT
    ...
    await gateway.stop()

Services: `tether.v1.Bridge` (sessions), `tether.v1.Policies` (publish, list, fetch versions),
`tether.v1.Experience` (the log, when there is one), and gRPC health.

Health stays SERVING while the experience log is degraded (a disk that refuses writes): sessions
still act, only logging waits. `gateway.logging_state()` ("ok", "off", "degraded: <why>") is what
FleetStatus.logging, the console and the `tether_experience_degraded` gauge show instead.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import secrets
import signal
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bridge.gate import Gate, GateConfig
from bridge.gateway.batcher import MicroBatcher
from bridge.gateway.errors import DuplicateSession, InvalidHello
from bridge.gateway.figures import FleetFigures
from bridge.gateway.holds import EStops, open_estop_registry
from bridge.gateway.limits import Admission, Limits, check_hello, may_route
from bridge.gateway.policies import PolicyCatalog, check_compatible
from bridge.gateway.policies_service import PoliciesService
from bridge.gateway.publisher import Publisher, PublishLimits
from bridge.gateway.recorder import Recorder, RecorderGroup
from bridge.gateway.rollout import RolloutController
from bridge.gateway.rollout_config import RolloutPlan, open_registry
from bridge.gateway.rollout_config import add_arguments as add_rollout_arguments
from bridge.gateway.rollout_config import from_arguments as rollout_settings
from bridge.gateway.service import BridgeService
from bridge.gateway.session import Session, SessionStats
from bridge.gateway.vector_session import VectorSession
from bridge.metrics import GatewayMetrics
from bridge.rewards import RewardConfigError, RewardFunction
from bridge.security import Authorizer
from bridge.security.tls import InsecureBind, TlsFiles, check_exposure, is_loopback, server_credentials
from bridge.security.tokens import TokenError, TokenStore
from inference_server import ModelRepository, PolicyClient
from protos import bridge_pb2, bridge_pb2_grpc, fleet_pb2_grpc, policies_pb2_grpc
from protos.codec import TensorError, specs_from_proto

log = logging.getLogger("tether.gateway")
SERVICE_NAME = bridge_pb2.DESCRIPTOR.services_by_name["Bridge"].full_name
MAX_MESSAGE_BYTES = 64 << 20  # camera observations: a 1080p RGB frame alone is 6 MB (gRPC's default cap: 4 MB)
# A dead peer's streams end within ~30 s (ping every 20 s, 10 s to answer, also on idle streams); a
# connection with no RPC for 5 min is closed; clients may ping every 5 s.
KEEPALIVE = [("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 10_000),
             ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
             ("grpc.http2.min_ping_interval_without_data_ms", 5_000), ("grpc.max_connection_idle_ms", 300_000)]


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    triton_url: str
    policy: str = ""                 # default policy for sessions that name none
    host: str = "127.0.0.1"
    port: int = 0                    # 0 = a free port
    deadline_ms: int = 100           # per-step inference deadline
    max_batch: int = 64
    max_inflight: int = 1            # concurrent Triton batches per policy version (1 = biggest batches)
    triton_timeout_s: float = 10.0   # how long start() waits for Triton to be ready
    model_repository: Path | None = None  # Triton's repository (same host): needed to publish versions
    experience_dir: Path | None = None    # the experience log; None = no logging
    fsync_interval_ms: float = 5.0        # group commit: the longest a transition waits to be on disk
    log_max_pending: int = 100_000        # the log's bound: transitions not yet on disk (bridge.experience.log)
    log_max_pending_mb: float = 1024.0    # ... and their serialized size; beyond either, LogFull
    log_retention_mb: float | None = None     # delete finished segments, oldest first, past this total; None = keep
    log_retention_hours: float | None = None  # ... and those last written longer ago than this; None = keep
    rewards: Mapping[str, Path] = field(default_factory=dict)  # policy -> reward config YAML
    switch: str = "episode"          # when sessions move to a new version: "episode" or "step"
    rollout: RolloutPlan = field(default_factory=RolloutPlan)  # direct, or staged shadow -> canary -> live
    registry: Path | None = None     # default: <model_repository>/.tether/registry.sqlite; no repository: in memory
    #                                  (e-stops then go to <experience_dir>/.tether/estops.sqlite: bridge.gateway.holds)
    gate: GateConfig = field(default_factory=GateConfig)  # what a candidate version must pass (bridge.gate)
    # bridge.security: TLS (mTLS with tls_client_ca), the --insecure rule, tokens; bridge.gateway.limits
    tls_cert: Path | None = None     # server certificate (PEM); with tls_key, gRPC serves TLS only
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # every client must present a certificate signed by this CA (mTLS)
    insecure: bool = False           # allow plaintext on a non-loopback host (warned loudly)
    tokens: Path | None = None       # operator/trainer tokens file (`tether token add`)
    anonymous_viewers: bool = True   # read-only viewing without credentials
    limits: Limits = field(default_factory=Limits)  # session caps, idle timeout, Hello string bounds
    publish_limits: PublishLimits = field(default_factory=PublishLimits)  # publishes in flight, bytes they hold
    gate_tls_ca: Path | None = None    # what the gate's `tether sim` sessions verify the gateway with (default:
    gate_tls_cert: Path | None = None  # tls_client_ca); under mTLS, the certificate + key they present
    gate_tls_key: Path | None = None
    console_port: int | None = None  # the operator console + /metrics over HTTP (0 = a free port); None = off
    console_host: str = "127.0.0.1"
    console_allowed_hosts: tuple[str, ...] = ()  # Host names the console also answers to (behind a proxy)

    def __post_init__(self):
        if self.deadline_ms <= 0:
            raise ValueError(f"deadline_ms must be positive, got {self.deadline_ms}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port out of range: {self.port}")
        if self.console_port is not None and not 0 <= self.console_port < 65536:
            raise ValueError(f"console_port out of range: {self.console_port}")
        if self.switch not in ("episode", "step"):
            raise ValueError(f"switch must be 'episode' or 'step', got {self.switch!r}")
        if self.fsync_interval_ms < 0:
            raise ValueError(f"fsync_interval_ms must be >= 0, got {self.fsync_interval_ms}")
        if self.log_max_pending < 1 or not self.log_max_pending_mb > 0:
            raise ValueError(f"log_max_pending ({self.log_max_pending}) and log_max_pending_mb "
                             f"({self.log_max_pending_mb}) must be positive")
        if self.log_retention_mb is not None and not self.log_retention_mb > 0:
            raise ValueError(f"log_retention_mb must be > 0, got {self.log_retention_mb}")
        if self.log_retention_hours is not None and not self.log_retention_hours > 0:
            raise ValueError(f"log_retention_hours must be > 0, got {self.log_retention_hours}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError(f"TLS needs both tls_cert and tls_key, got cert={self.tls_cert} key={self.tls_key}")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca (mTLS) needs tls_cert and tls_key")


class Gateway:
    def __init__(self, config: GatewayConfig):
        self.config = config
        self._client = PolicyClient(config.triton_url, timeout_s=config.deadline_ms / 1e3)
        self.control = PolicyClient(config.triton_url, timeout_s=60.0)  # loads, probes, metadata
        self.catalog = PolicyCatalog(self.control, default=config.policy)
        self.batcher = MicroBatcher(self._client, max_batch=config.max_batch,
                                    max_inflight=config.max_inflight)
        self.repository = ModelRepository(config.model_repository) if config.model_repository else None
        self.publisher = Publisher(repository=self.repository, client=self.control, limits=config.publish_limits)
        self.registry = open_registry(config.registry, self.repository)
        self.rollout = RolloutController(
            registry=self.registry, catalog=self.catalog, control=self.control, batcher=self.batcher,
            publisher=self.publisher, repository=self.repository, plan=config.rollout,
            gate=Gate(client=self.control, experience_dir=config.experience_dir, evaluator=None, config=config.gate),
            in_use=lambda name: set(self.acting_versions(name)), sessions=lambda: list(self.sessions.values()))
        self.rewards = {policy: RewardFunction.from_yaml(path) for policy, path in config.rewards.items()}
        self.experience = None  # the ExperienceLog, once started
        self.auth = _authorizer(config)  # who may view and act (bridge.security)
        self.admission = Admission(config.limits)  # session caps (bridge.gateway.limits)
        from bridge.console.fleet import Fleet  # here: bridge.console imports bridge.gateway's modules

        # operators' e-stops, durable (the registry, else <experience_dir>/.tether/estops.sqlite), and the held replies
        self.estops = EStops(open_estop_registry(self.registry, config.experience_dir))
        self.figures = FleetFigures(GatewayMetrics(self))  # per-session figures and metrics (bridge.gateway.figures)
        self.fleet = Fleet(self)  # what operators see and do: displays the above, forwards e-stops (bridge.console)
        self.console = None       # the HTTP console, when config.console_port is set
        self.sessions: dict[str, Session | VectorSession] = {}
        self.closed_stats: deque[SessionStats] = deque(maxlen=1024)  # the most recent closed sessions
        self.server_version = ""
        self._ids = itertools.count(1)  # ids the gateway gives: session-<boot>-<n> (see new_session_id)
        self._boot = secrets.token_hex(4)  # this start's: ids never repeat across restarts
        self._last_seen: OrderedDict[str, int] = OrderedDict()  # closed sessions' last steps (newest 4096)
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self.address = ""

    async def start(self) -> None:
        """Wait for Triton (a clear error if it is not there), then serve on the configured port."""
        c = self.config
        tls = TlsFiles(cert=c.tls_cert, key=c.tls_key, client_ca=c.tls_client_ca) if c.tls_cert else None
        check_exposure(c.host, tls=tls is not None, insecure=c.insecure)  # InsecureBind: plaintext off loopback
        if c.console_port is not None:  # the console: HTTPS with the same certificate, the same rule
            check_exposure(c.console_host, tls=tls is not None, insecure=c.insecure, what="console")
            from bridge.console.server import check_console_bind

            check_console_bind(c.console_host, self.auth)  # ExposedConsole: off loopback, credentials needed
        log.info("gateway security: %s; %s", ("mTLS (client certificates required)" if c.tls_client_ca else "TLS")
                 if tls else "plaintext", self.auth.describe())
        try:
            await self._client.wait_ready(self.config.triton_timeout_s)
        except Exception as exc:
            raise ConnectionError(f"Triton at {self.config.triton_url} is not ready after "
                                  f"{self.config.triton_timeout_s:g} s: {exc}") from exc
        self.server_version = await self._client.server_version()
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0),  # a taken port is an error, not shared
                                                ("grpc.max_receive_message_length",
                                                 self.config.limits.max_message_mb << 20),
                                                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                                *KEEPALIVE])
        bridge_pb2_grpc.add_BridgeServicer_to_server(BridgeService(self), self._server)
        policies_pb2_grpc.add_PoliciesServicer_to_server(PoliciesService(self), self._server)
        from bridge.console.fleet_service import FleetService

        fleet_pb2_grpc.add_FleetServicer_to_server(FleetService(self), self._server)
        if self.config.experience_dir is not None:
            from bridge.experience.log import ExperienceLog
            from bridge.experience.service import ExperienceService
            from protos import experience_pb2_grpc

            mb, hours = c.log_retention_mb, c.log_retention_hours
            self.experience = ExperienceLog(
                self.config.experience_dir, fsync_interval_s=self.config.fsync_interval_ms / 1e3,
                max_pending=c.log_max_pending, max_pending_bytes=int(c.log_max_pending_mb * (1 << 20)),
                retention_bytes=None if mb is None else int(mb * (1 << 20)),
                retention_s=None if hours is None else hours * 3600)
            await self.experience.start()
            experience_pb2_grpc.add_ExperienceServicer_to_server(ExperienceService(
                self.experience, authorize=lambda context: self.auth.require(context, "trainer")), self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        bind = f"{self.config.host}:{self.config.port}"
        port = (self._server.add_secure_port(bind, server_credentials(tls)) if tls
                else self._server.add_insecure_port(bind))
        if port == 0:
            raise OSError(f"cannot bind the gateway to {self.config.host}:{self.config.port}")
        self.address = f"{self.config.host}:{port}"
        sims_at, sims_tls = _gate_sims(c, port)  # the gate's simulator sessions, through the same TLS
        if self.auth.tokens is not None and (c.gate.eval_env or c.gate.eval_envs):  # and a robot token of its own
            sims_tls["sim_env"] = {"TETHER_TOKEN": self.auth.issue("gate", "robot")}
        self.rollout.attach_evaluator(sims_at, **sims_tls)
        await self.rollout.start([self.config.policy] if self.config.policy else [])  # restore, verify what serves
        await self._server.start()
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.config.console_port is not None:
            from bridge.console.server import Console
            from bridge.security.tls import http_ssl_context

            self.console = Console(self, host=c.console_host, port=c.console_port,
                                   allowed_hosts=c.console_allowed_hosts,
                                   ssl_context=http_ssl_context(tls) if tls else None)
            await self.console.start()
            self.fleet.console_url = self.console.url
            log.info("console on %s", self.console.url)
        log.info("gateway serving on %s (Triton %s at %s)", self.address, self.server_version,
                 self.config.triton_url)

    async def stop(self, grace: float = 1.0) -> None:
        await self._health.enter_graceful_shutdown()
        if self.console is not None:
            await self.console.stop()
        if self._server is not None:
            await self._server.stop(grace)
        for session in list(self.sessions.values()):
            session.flush()
        if self.experience is not None:
            await self.experience.close()
        await self.rollout.stop()
        if self.estops.registry is not self.registry:
            self.estops.registry.close()
        self.registry.close()
        await self._client.close()
        await self.control.close()

    async def wait(self) -> None:
        await self._server.wait_for_termination()

    async def authorize_session(self, context: grpc.aio.ServicerContext) -> str | None:
        """Who opens a session: with tokens or client certificates configured, an identity holding the
        robot role (or operator), else Unauthenticated / PermissionDenied naming the role; None when no
        credentials are configured (open access, or an --insecure bind without them)."""
        if not self.auth.checks:
            return None
        return await self.auth.require(context, "robot")

    async def open_session(self, hello: bridge_pb2.Hello, *, peer: str = "local",
                           identity: str | None = None) -> Session | VectorSession:
        """`identity`: who the caller proved to be (`authorize_session`); it is the session's source for the
        per-identity cap, for the gate's bounds, and decides whether its labels route (limits.may_route)."""
        check_hello(hello, self.config.limits)  # bounded strings and spec bounds, num_envs: InvalidHello naming it
        peer = identity or peer
        self.admission.check(peer)  # caps: TooManySessions (RESOURCE_EXHAUSTED); counted when added below
        try:
            observation = specs_from_proto(hello.observation_spec)
            action = specs_from_proto(hello.action_spec)
        except TensorError as exc:
            raise InvalidHello(f"bad spec in Hello: {exc}") from exc
        if not observation or not action:
            raise InvalidHello("Hello must declare an observation_spec and an action_spec")
        policy = await self.catalog.resolve(hello.policy)
        await self.rollout.track(policy.name)
        if why := check_compatible(policy, observation, action):
            raise InvalidHello(why)
        rewards = self.rewards.get(policy.name) or RewardFunction.passthrough()
        try:
            rewards.check_specs(observation, action)
        except RewardConfigError as exc:
            raise InvalidHello(f"the reward config of policy {policy.name!r} does not fit this session: {exc}") from exc
        session_id = hello.session_id or self.new_session_id()
        if session_id in self.sessions:
            raise DuplicateSession(f"session {session_id!r} is already connected")
        route = dict(hello.labels) if may_route(self.config.limits, identity or "", open_access=identity is None
                                                or self.auth.open_access) else {}
        labelled = self.rollout.acting(policy.name, session_id, dict(hello.labels)) if hello.labels and not route \
            else None
        policy = self.rollout.acting(policy.name, session_id, route) or policy  # pins, canary, live
        if hello.labels and not route:
            (log.warning if labelled is not None and labelled is not policy else log.info)(
                "session %s: labels of %s do not route (not an operator, not in --route-labels-from): they "
                "would have chosen %s, it acts with v%d", session_id, identity,
                f"v{labelled.version}" if labelled is not None else "nothing", policy.version)
        self.rollout.declared(policy.name, action, identity=identity, source=f"{peer} {hello.source or session_id}")
        experience = None if session_id in self.rollout.evaluating else self.experience  # the gate's: not data
        if hello.num_envs > 1 or hello.batched:
            num_envs = max(1, hello.num_envs)
            group = RecorderGroup(session=session_id, source=hello.source, log=experience,
                                  reward_version=rewards.version, num_envs=num_envs)
            session = VectorSession(session_id=session_id, source=hello.source, policy=policy, num_envs=num_envs,
                                    observation_spec=observation, action_spec=action, batcher=self.batcher,
                                    deadline_s=self.config.deadline_ms / 1e3, rewards=rewards, recorder=group,
                                    router=self.rollout, labels=dict(hello.labels))
            session.route_labels = route
            self.admission.admit(session_id, peer=peer)
            self.sessions[session_id] = session
            log.info("vector session %s (%d envs) from %s on %s v%d", session_id, num_envs, hello.source or "?",
                     policy.name, policy.version)
            return session
        recorder = Recorder(session=session_id, source=hello.source, log=experience,
                            reward_version=rewards.version)
        session = Session(session_id=session_id, source=hello.source, policy=policy,
                          observation_spec=observation, action_spec=action, batcher=self.batcher,
                          deadline_s=self.config.deadline_ms / 1e3, rewards=rewards, recorder=recorder,
                          router=self.rollout, switch=self.config.switch, labels=dict(hello.labels))
        session.route_labels = route
        self.admission.admit(session_id, peer=peer)
        self.sessions[session_id] = session
        log.info("session %s from %s on %s v%d", session_id, hello.source or "?", policy.name, policy.version)
        return session

    def logging_state(self) -> str:
        """FleetStatus.logging: "off" (no experience log), "ok", or "degraded: <why>" (the disk refuses
        writes: sessions go on acting, durable_through stands still, the writer retries)."""
        if self.experience is None:
            return "off"
        why = self.experience.degraded
        return "ok" if why is None else f"degraded: {why}"

    def new_session_id(self) -> str:
        """An id for a client that names none: `session-<boot>-<n>`, with a random boot component of
        this gateway start, so ids never repeat across restarts (the log remembers old sessions'
        last steps: a repeated id would make a fresh client's step 0 OUT_OF_ORDER); an id the log or
        this gateway already knows is skipped."""
        while True:
            session_id = f"session-{self._boot}-{next(self._ids)}"
            known = self.experience is not None and self.experience.last_step(session_id) is not None
            if not known and session_id not in self.sessions and session_id not in self._last_seen:
                return session_id

    def next_step(self, session: Session | VectorSession) -> int:
        """Welcome.next_step: the lowest step accepted next for this id, the last step the log or this
        gateway has seen of it + 1 (0 for a new id). A client continuing its counter from here is never
        OUT_OF_ORDER."""
        seen = self._last_seen.get(session.id)
        return max(session.recorder.next_step, 0 if seen is None else seen + 1)

    def welcome(self, session: Session | VectorSession) -> bridge_pb2.Welcome:
        return bridge_pb2.Welcome(session_id=session.id, policy=session.policy.name,
                                  policy_version=session.policy.version,
                                  deadline_ms=self.config.deadline_ms, server_version=self.server_version,
                                  durable_through=session.recorder.durable_through,
                                  next_step=self.next_step(session),
                                  reward_version=session.rewards.version, logging=session.recorder.logging)

    def acting_versions(self, policy: str) -> dict[int, int]:
        """Version -> how many sessions act with it now."""
        return dict(Counter(s.policy.version for s in self.sessions.values() if s.policy.name == policy))

    def close_session(self, session: Session | VectorSession) -> None:
        if self.sessions.get(session.id) is session:
            self.admission.release(session.id)
            session.flush()
            del self.sessions[session.id]
            self.closed_stats.append(session.stats)
            if getattr(session, "_last_step", None) is not None:  # for Welcome.next_step of a reconnect
                self._last_seen[session.id] = session._last_step
                self._last_seen.move_to_end(session.id)
                while len(self._last_seen) > 4096:
                    self._last_seen.popitem(last=False)
            stats, guard = session.stats, session.stats.guard
            log.info("session %s closed: %d steps, %d episodes, errors %s, edge guard clamped %d rate-limited %d "
                     "watchdog %d estop %d", session.id, stats.steps, stats.episodes, stats.errors or "none",
                     guard.clamped, guard.rate_limited, guard.watchdog, guard.estop)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tether gateway", description="Serve tether.v1.Bridge in front of Triton.")
    p.add_argument("--triton", required=True, help="Triton gRPC address HOST:PORT")
    p.add_argument("--policy", default="", help="default policy (Triton model name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50051)
    p.add_argument("--deadline-ms", type=int, default=100)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--triton-timeout", type=float, default=10.0, help="seconds to wait for Triton at start")
    p.add_argument("--max-inflight", type=int, default=1, help="concurrent Triton batches per policy version")
    p.add_argument("--model-repository", type=Path, help="Triton's model repository (to publish new versions)")
    p.add_argument("--experience-dir", type=Path, help="log every transition here (MCAP segments); without a "
                   "registry file, operators' e-stops are kept here too (.tether/estops.sqlite)")
    p.add_argument("--fsync-interval-ms", type=float, default=5.0, help="group commit interval of the log")
    p.add_argument("--log-max-pending", type=int, default=100_000,
                   help="the log's bound: transitions not yet on disk; beyond it a session's transitions are not "
                        "logged until it reconnects and replays them (counted: tether_experience_refused)")
    p.add_argument("--log-max-pending-mb", type=float, default=1024.0, help="the same bound in MB")
    p.add_argument("--log-retention-mb", type=float, help="delete the oldest finished segments past this total "
                   "(default: keep all)")
    p.add_argument("--log-retention-hours", type=float, help="delete finished segments last written longer ago "
                   "(default: keep all)")
    p.add_argument("--rewards", action="append", default=[], metavar="POLICY=YAML",
                   help="reward config of a policy (repeatable); default: the simulator's reward")
    p.add_argument("--switch", choices=("episode", "step"), default="episode",
                   help="when sessions move to a newly published version")
    add_rollout_arguments(p)
    p.add_argument("--console-port", type=int, help="serve the operator console and /metrics here (0 = a free port)")
    p.add_argument("--console-host", default="127.0.0.1", help="the console's bind address (not loopback: the "
                   "gateway needs --tokens or --tls-client-ca)")
    p.add_argument("--console-allowed-host", action="append", default=[], metavar="NAME[:PORT]",
                   type=_console_allowed_host, help="a Host name the console also answers to, e.g. behind a "
                   "proxy (repeatable); other Hosts get 421")
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="json: one JSON object a line, with the session and policy version")
    s = p.add_argument_group("security and limits (bridge.security, bridge.gateway.limits)")
    s.add_argument("--tls-cert", type=Path, help="server certificate (PEM): serve gRPC over TLS")
    s.add_argument("--tls-key", type=Path, help="the server certificate's private key (PEM)")
    s.add_argument("--tls-client-ca", type=Path, help="require client certificates signed by this CA (mTLS)")
    s.add_argument("--insecure", action="store_true", help="allow plaintext on a non-loopback --host (loud warning)")
    s.add_argument("--tokens", type=Path, help="operator/trainer tokens file (tether token add)")
    s.add_argument("--no-anonymous-viewers", dest="anonymous_viewers", action="store_false",
                   help="viewing (read-only RPCs, console) also needs a token or certificate")
    s.add_argument("--max-sessions", type=int, default=Limits.max_sessions, help="0 = no cap")
    s.add_argument("--max-sessions-per-source", "--max-sessions-per-identity", dest="max_sessions_per_source",
                   type=int, default=Limits.max_sessions_per_source,
                   help="per identity (token or client certificate), else per address (0 = no cap)")
    s.add_argument("--max-envs", type=int, default=Limits.max_envs,
                   help="the most envs one vectorised session (Hello.num_envs) may declare")
    s.add_argument("--route-labels-from", action="append", default=[], metavar="IDENTITY|ROLE",
                   help="an identity (robot:arm_2) or role (robot) whose session labels choose canary membership "
                        "and label pins (repeatable; operators always may; open access: everyone)")
    s.add_argument("--idle-timeout-s", type=float, default=Limits.idle_timeout_s,
                   help="close a session silent this long (0 = never)")
    s.add_argument("--gate-tls-ca", type=Path, help="CA the gate's simulator sessions verify a TLS gateway with "
                   "(default: --tls-client-ca)")
    s.add_argument("--gate-tls-cert", type=Path, help="certificate the gate's simulator sessions present (mTLS)")
    s.add_argument("--gate-tls-key", type=Path, help="its private key")
    s.add_argument("--max-message-mb", type=int, default=Limits.max_message_mb,
                   help="largest message a client may send (a 1080p RGB frame is 6 MB; parsing one stalls the "
                        "event loop about 1-3 ms per MB)")
    s.add_argument("--max-publishes", type=int, default=PublishLimits.max_inflight,
                   help="publishes in flight at once (receiving, waiting for the gate, gated); more are "
                        "refused with RESOURCE_EXHAUSTED")
    s.add_argument("--max-publish-mb", type=int, default=PublishLimits.max_bytes >> 20,
                   help="MB of weights the publishes in flight may hold together (each counts its announced size)")
    return p.parse_args(argv)


def _console_allowed_host(value: str) -> str:
    from bridge.console.server import allowed_host  # lazily: bridge.console imports bridge.gateway's modules

    try:
        return allowed_host(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _security_kwargs(a: argparse.Namespace) -> dict:
    try:
        limits = _limits(a)
        publish_limits = PublishLimits(max_inflight=a.max_publishes, max_bytes=a.max_publish_mb << 20)
    except ValueError as exc:
        raise SystemExit(f"tether gateway: {exc}") from None
    return {"tls_cert": a.tls_cert, "tls_key": a.tls_key, "tls_client_ca": a.tls_client_ca, "insecure": a.insecure,
            "tokens": a.tokens, "anonymous_viewers": a.anonymous_viewers, "limits": limits,
            "publish_limits": publish_limits,
            "gate_tls_ca": a.gate_tls_ca, "gate_tls_cert": a.gate_tls_cert, "gate_tls_key": a.gate_tls_key}


def _limits(a: argparse.Namespace) -> Limits:
    return Limits(max_sessions=a.max_sessions, max_sessions_per_source=a.max_sessions_per_source,
                  idle_timeout_s=a.idle_timeout_s, max_message_mb=a.max_message_mb, max_envs=a.max_envs,
                  route_labels_from=tuple(a.route_labels_from))


def _gate_sims(c: GatewayConfig, port: int) -> tuple[str, dict]:
    """Where the gate's `tether sim` processes connect (a wildcard host: loopback, a name the certificate
    holds) and their TLS flags; warns when a TLS gateway gives them no way in."""
    host = "127.0.0.1" if c.host in ("0.0.0.0", "::", "[::]", "") else c.host
    if c.tls_cert is None:
        return f"{host}:{port}", {}
    ca = c.gate_tls_ca or c.tls_client_ca
    args = ["--tls-ca", str(ca)] if ca else []
    if c.gate_tls_cert and c.gate_tls_key:
        args += ["--tls-cert", str(c.gate_tls_cert), "--tls-key", str(c.gate_tls_key)]
    if (c.gate.eval_env or c.gate.eval_envs) and (not ca or (c.tls_client_ca and not c.gate_tls_cert)):
        log.warning("the gate's evaluation in simulation cannot connect to this TLS gateway: give --gate-tls-ca "
                    "(and under mTLS --gate-tls-cert/--gate-tls-key, e.g. tether certs client DIR gate --role robot)")
    return f"{host}:{port}", {"sim_args": args}


def _authorizer(config: GatewayConfig) -> Authorizer:
    """Open access only on loopback with no credentials configured; exposed (even --insecure), operator
    and trainer actions need a token or a client certificate."""
    tokens = TokenStore(config.tokens) if config.tokens is not None else None
    mtls = config.tls_client_ca is not None
    open_access = tokens is None and not mtls and is_loopback(config.host)
    return Authorizer(tokens=tokens, client_certs=mtls, open_access=open_access,
                      anonymous_viewers=config.anonymous_viewers)


def _reward_configs(items: list[str]) -> dict[str, Path]:
    configs = {}
    for item in items:
        policy, sep, path = item.partition("=")
        if not sep or not policy or not path:
            raise SystemExit(f"tether gateway: --rewards takes POLICY=YAML, got {item!r}")
        configs[policy] = Path(path)
    return configs


async def serve(config: GatewayConfig) -> None:
    """Run a gateway until SIGINT/SIGTERM."""
    gateway = Gateway(config)
    await gateway.start()
    print(f"gateway listening on {gateway.address}", flush=True)
    if gateway.console is not None:
        print(f"console on {gateway.console.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await gateway.stop()


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    from bridge.console.logs import configure_logging

    configure_logging(a.log_format)
    config = GatewayConfig(triton_url=a.triton, policy=a.policy, host=a.host, port=a.port,
                           deadline_ms=a.deadline_ms, max_batch=a.max_batch, max_inflight=a.max_inflight,
                           triton_timeout_s=a.triton_timeout, model_repository=a.model_repository,
                           experience_dir=a.experience_dir, fsync_interval_ms=a.fsync_interval_ms,
                           log_max_pending=a.log_max_pending, log_max_pending_mb=a.log_max_pending_mb,
                           log_retention_mb=a.log_retention_mb, log_retention_hours=a.log_retention_hours,
                           rewards=_reward_configs(a.rewards), switch=a.switch, **_security_kwargs(a),
                           console_port=a.console_port, console_host=a.console_host,
                           console_allowed_hosts=tuple(a.console_allowed_host), **rollout_settings(a))
    try:
        asyncio.run(serve(config))
    except RewardConfigError as exc:
        raise SystemExit(f"tether gateway: {exc}") from None
    except (InsecureBind, TokenError, FileNotFoundError) as exc:  # bridge.security: a refusal, not a traceback
        raise SystemExit(f"tether gateway: {exc}") from None
