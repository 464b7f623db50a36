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

Here: the wiring (what a Gateway holds, start, stop). The configuration and its flags are
`bridge.gateway.config`, a Hello becoming a session `bridge.gateway.session.factory`. The operator's side
(tether.v1.Fleet, the console) is composed on top of this class by `bridge.app.GatewayApp`, which is what
`tether gateway` runs: the gateway never imports the console.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from bridge.gate import Gate
from bridge.gateway.config import GatewayConfig
from bridge.gateway.errors import Draining
from bridge.gateway.replicas.pool import ReplicaMetrics
from bridge.gateway.replicas.pool import from_config as replicas_from_config
from bridge.gateway.rollout.config import open_registry
from bridge.gateway.rollout.controller import RolloutController
from bridge.gateway.session.batcher import MicroBatcher
from bridge.gateway.session.factory import SessionFactory
from bridge.gateway.session.figures import FleetFigures
from bridge.gateway.session.holds import EStops, open_estop_registry
from bridge.gateway.session.limits import Admission
from bridge.gateway.session.owners import SessionOwners
from bridge.gateway.session.service import BridgeService
from bridge.gateway.session.session import Session, SessionStats
from bridge.gateway.session.vector import VectorSession
from bridge.gateway.versions.catalog import PolicyCatalog
from bridge.gateway.versions.publisher import Publisher
from bridge.gateway.versions.service import PoliciesService
from bridge.metrics import GatewayMetrics
from bridge.rewards import RewardFunction
from bridge.security import Authorizer
from bridge.security.tls import TlsFiles, check_exposure, is_loopback, server_credentials
from bridge.security.tokens import TokenStore
from inference_server import ModelRepository, PolicyClient
from inference_server.persistent import persistent_clients
from inference_server.repository import VERSIONS_SUFFIX
from inference_server.secret import read_secret
from protos import bridge_pb2, bridge_pb2_grpc, policies_pb2_grpc

__all__ = ["Gateway", "GatewayConfig"]

log = logging.getLogger("tether.gateway")
SERVICE_NAME = bridge_pb2.DESCRIPTOR.services_by_name["Bridge"].full_name
MAX_MESSAGE_BYTES = 64 << 20  # camera observations: a 1080p RGB frame alone is 6 MB (gRPC's default cap: 4 MB)
# A dead peer's streams end within ~30 s (ping every 20 s, 10 s to answer, also on idle streams); a
# connection with no RPC for 5 min is closed; clients may ping every 5 s.
KEEPALIVE = [("grpc.keepalive_time_ms", 20_000), ("grpc.keepalive_timeout_ms", 10_000),
             ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
             ("grpc.http2.min_ping_interval_without_data_ms", 5_000), ("grpc.max_connection_idle_ms", 300_000)]


class Gateway:
    def __init__(self, config: GatewayConfig):
        self.config = config
        # several Triton replicas (--triton A,B): routed, verified per version (bridge.gateway.replicas.pool)
        # Triton's restricted protocols: the secret goes with every call (inference_server.secret)
        secret = read_secret(config.triton_secret_file) if config.triton_secret_file else None
        self.replicas = replicas_from_config(config, secret=secret) if len(config.triton_urls) > 1 else None
        self._client = self.replicas.hot if self.replicas is not None else \
            PolicyClient(config.triton_url, timeout_s=config.deadline_ms / 1e3, secret=secret)
        self.control = self.replicas if self.replicas is not None else \
            PolicyClient(config.triton_url, timeout_s=60.0, secret=secret)  # loads, probes, metadata
        if config.persistent_versions:  # ONNX versions: one persistent model per policy (inference_server.persistent)
            self._client, self.control = persistent_clients(self._client, self.control,
                                                            ModelRepository(config.model_repository))
        self.catalog = PolicyCatalog(self.control, default=config.policy)
        self.batcher = MicroBatcher(self._client, max_batch=config.max_batch,  # --max-inflight is per replica
                                    max_inflight=config.max_inflight * len(config.triton_urls),
                                    order=config.batch_order)
        self.repository = ModelRepository(config.model_repository) if config.model_repository else None
        self.publisher = Publisher(repository=self.repository, client=self.control, limits=config.publish_limits)
        self.registry = open_registry(config.registry, self.repository)
        if self.replicas is not None:
            self.replicas.attach(self.registry)  # per-replica verification rows beside the registry
        self.rollout = RolloutController(
            registry=self.registry, catalog=self.catalog, control=self.control, batcher=self.batcher,
            publisher=self.publisher, repository=self.repository, plan=config.rollout,
            gate=Gate(client=self.control, experience_dir=config.experience_dir, evaluator=None, config=config.gate),
            in_use=lambda name: set(self.acting_versions(name)), sessions=lambda: list(self.sessions.values()))
        self.rewards = {policy: RewardFunction.from_yaml(path) for policy, path in config.rewards.items()}
        self.experience = None  # the ExperienceLog, once started
        self.auth = _authorizer(config)  # who may view and act (bridge.security)
        self.admission = Admission(config.limits)  # session caps (bridge.gateway.session.limits)
        # operators' e-stops, durable (the registry, else <experience_dir>/.tether/estops.sqlite), and the held replies
        self.estops = EStops(open_estop_registry(self.registry, config.experience_dir))
        self.figures = FleetFigures(GatewayMetrics(self))  # per-session figures and metrics (session.figures)
        if self.replicas is not None:  # tether_triton_replica_* in /metrics
            self.figures.metrics.registry.register(ReplicaMetrics(self.replicas))
        self.sessions: dict[str, Session | VectorSession] = {}
        self.closed_stats: deque[SessionStats] = deque(maxlen=1024)  # the most recent closed sessions
        self.server_version = ""
        # Hello -> Session | VectorSession, the ids and next steps (bridge.gateway.session.factory)
        self.factory = SessionFactory(
            limits=config.limits, deadline_s=config.deadline_ms / 1e3, switch=config.switch, catalog=self.catalog,
            rollout=self.rollout, rewards=self.rewards, admission=self.admission, batcher=self.batcher,
            sessions=self.sessions, experience=lambda: self.experience, open_access=lambda: self.auth.open_access,
            close=self.close_session,  # a takeover (same id, same identity) closes the old session
            decode_threads=config.decode_threads)  # camera frames: session.images
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self.address = ""
        # several gateways: who owns each session id, with an epoch that fences the others (session.owners)
        self.owners = SessionOwners(self)
        self.factory._claim = self.owners.claim
        self.draining = False  # SIGTERM: no new session, streams end UNAVAILABLE (drain)

    async def start(self) -> None:
        """Wait for Triton (a clear error if it is not there), then serve on the configured port."""
        c = self.config
        tls = self.tls_files()
        check_exposure(c.host, tls=tls is not None, insecure=c.insecure)  # InsecureBind: plaintext off loopback
        log.info("gateway security: %s; %s", ("mTLS (client certificates required)" if c.tls_client_ca else "TLS")
                 if tls else "plaintext", self.auth.describe())
        try:
            if self.replicas is not None:  # each reachable replica synced, loaded and verified
                await self.replicas.start(c.triton_timeout_s, models=[c.policy] if c.policy else [])
            await self._client.wait_ready(self.config.triton_timeout_s)
        except Exception as exc:
            raise ConnectionError(f"Triton at {self.config.triton_url} is not ready after "
                                  f"{self.config.triton_timeout_s:g} s: {exc}") from exc
        self.server_version = await self._client.server_version()
        if c.persistent_versions and c.policy:
            served = await self.control.setup(c.policy)
            log.info("policy %s: %s", c.policy, "its versions served by the persistent model "
                     f"{c.policy}{VERSIONS_SUFFIX}" if served else "served by torch: one Triton stub per version")
        self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0),  # a taken port is an error, not shared
                                                ("grpc.max_receive_message_length",
                                                 self.config.limits.max_message_mb << 20),
                                                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                                *KEEPALIVE])
        self.add_services(self._server)
        if self.config.experience_dir is not None:
            from bridge.experience.log import ExperienceLog
            from bridge.experience.service import ExperienceService
            from protos import experience_pb2_grpc

            mb, hours = c.log_retention_mb, c.log_retention_hours
            self.experience = ExperienceLog(
                self.config.experience_dir, fsync_interval_s=self.config.fsync_interval_ms / 1e3,
                max_pending=c.log_max_pending, max_pending_bytes=int(c.log_max_pending_mb * (1 << 20)),
                retention_bytes=None if mb is None else int(mb * (1 << 20)),
                retention_s=None if hours is None else hours * 3600,
                **self.owners.log_hooks())
            await self.experience.start()
            experience_pb2_grpc.add_ExperienceServicer_to_server(ExperienceService(
                self.experience, authorize=lambda context: self.auth.require(context, "trainer")), self._server)
        if c.experience_url:  # experience to NATS JetStream, beside or instead of the local log
            from bridge.experience.jetstream_log import JetStreamLog
            from bridge.experience.tee import TeeLog

            stream = JetStreamLog(c.experience_url, max_pending=c.log_max_pending, auth=c.nats_auth,
                                  max_pending_bytes=int(c.log_max_pending_mb * (1 << 20)), **self.owners.log_hooks())
            await stream.start()
            self.experience = stream if self.experience is None else TeeLog(self.experience, stream)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        bind = f"{self.config.host}:{self.config.port}"
        port = (self._server.add_secure_port(bind, server_credentials(tls)) if tls
                else self._server.add_insecure_port(bind))
        if port == 0:
            raise OSError(f"cannot bind the gateway to {self.config.host}:{self.config.port}")
        self.address = f"{self.config.host}:{port}"
        self.owners.name = self.config.gateway_id or self.address
        sims_at, sims_tls = _gate_sims(c, port)  # the gate's simulator sessions, through the same TLS
        if self.auth.tokens is not None and (c.gate.eval_env or c.gate.eval_envs):  # and a robot token of its own
            sims_tls["sim_env"] = {"TETHER_TOKEN": self.auth.issue("gate", "robot")}
        self.rollout.attach_evaluator(sims_at, **sims_tls)
        await self.rollout.start([self.config.policy] if self.config.policy else [])  # restore, verify what serves
        await self._server.start()
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("gateway serving on %s (Triton %s at %s)", self.address, self.server_version,
                 self.config.triton_url)

    async def drain(self, grace_s: float = 0.2, timeout_s: float = 5.0) -> None:
        """SIGTERM: health NOT_SERVING and no new session (UNAVAILABLE "draining"); after `grace_s` (in-flight
        replies go out, health watchers see it) every stream ends UNAVAILABLE "draining", so its client moves to
        another gateway at once and replays what is not durable; returns once they closed (or `timeout_s`).
        `stop` then flushes and closes the log."""
        self.draining = True
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await asyncio.sleep(grace_s)
        sessions = list(self.sessions.values())
        log.warning("gateway %s draining: ending %d sessions' streams (UNAVAILABLE), their clients move on",
                    self.owners.name, len(sessions))
        for session in sessions:
            if session.on_drain is not None:
                session.on_drain(f"gateway {self.owners.name} is draining (shutting down): connect to another")
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.sessions and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)

    async def stop(self, grace: float = 1.0) -> None:
        await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace)
        for session in list(self.sessions.values()):
            session.flush()
        if self.experience is not None:
            await self.experience.close()
        await self.rollout.stop()
        self.factory.close()  # the image decoding threads
        self.owners.close()
        if self.estops.registry is not self.registry:
            self.estops.registry.close()
        self.registry.close()
        await self._client.close()
        await self.control.close()

    def add_services(self, server: grpc.aio.Server) -> None:
        """The gRPC services every gateway serves: tether.v1.Bridge and Policies (Experience and health are added
        by `start` as configured). A composition above the gateway (bridge.app) adds its own."""
        bridge_pb2_grpc.add_BridgeServicer_to_server(BridgeService(self), server)
        policies_pb2_grpc.add_PoliciesServicer_to_server(PoliciesService(self), server)

    def tls_files(self) -> TlsFiles | None:
        """The server certificate (and client CA for mTLS) the gateway serves with, None for plaintext."""
        c = self.config
        return TlsFiles(cert=c.tls_cert, key=c.tls_key, client_ca=c.tls_client_ca) if c.tls_cert else None

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
        """A session for `hello` from `peer`, proved to be `identity` (`authorize_session`): SessionFactory.open.
        Draining (SIGTERM): `Draining` (UNAVAILABLE), the client tries its next gateway."""
        if self.draining:
            raise Draining(f"gateway {self.owners.name} is draining (shutting down): connect to another")
        return await self.factory.open(hello, peer=peer, identity=identity)

    def logging_state(self) -> str:
        """FleetStatus.logging: "off" (no experience log), "ok", or "degraded: <why>" (the disk refuses
        writes: sessions go on acting, durable_through stands still, the writer retries)."""
        if self.experience is None:
            return "off"
        why = self.experience.degraded
        return "ok" if why is None else f"degraded: {why}"

    def new_session_id(self) -> str:
        return self.factory.new_session_id()

    def next_step(self, session: Session | VectorSession) -> int:
        return self.factory.next_step(session)

    def welcome(self, session: Session | VectorSession, *, hello_recv_ns: int = 0) -> bridge_pb2.Welcome:
        """The Welcome for an opened session; with the Hello's arrival time it is a clock sample for the client."""
        return bridge_pb2.Welcome(session_id=session.id, policy=session.policy.name,
                                  policy_version=session.policy.version,
                                  deadline_ms=self.config.deadline_ms, server_version=self.server_version,
                                  durable_through=session.recorder.durable_through,
                                  next_step=self.next_step(session),
                                  reward_version=session.rewards.version, logging=session.recorder.logging,
                                  owner_epoch=session.recorder.epoch, gateway_id=self.owners.name,
                                  hello_recv_ns=hello_recv_ns, welcome_send_ns=time.time_ns())

    def acting_versions(self, policy: str) -> dict[int, int]:
        """Version -> how many sessions act with it now."""
        return dict(Counter(s.policy.version for s in self.sessions.values() if s.policy.name == policy))

    def close_session(self, session: Session | VectorSession) -> None:
        if self.sessions.get(session.id) is session:
            self.admission.release(session.id)
            session.flush()
            del self.sessions[session.id]
            self.closed_stats.append(session.stats)
            self.factory.closed(session)  # its last step, for Welcome.next_step of a reconnect
            stats, guard = session.stats, session.stats.guard
            log.info("session %s closed: %d steps, %d episodes, errors %s, edge guard clamped %d rate-limited %d "
                     "watchdog %d estop %d", session.id, stats.steps, stats.episodes, stats.errors or "none",
                     guard.clamped, guard.rate_limited, guard.watchdog, guard.estop)


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
