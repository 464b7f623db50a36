"""The gateway's configuration: `GatewayConfig`, and its command-line flags.

    p = argparse.ArgumentParser()
    add_arguments(p)                                   # --triton, --policy, --deadline-ms, TLS, limits, rollout
    config = from_arguments(p.parse_args(argv))        # a GatewayConfig; a bad value exits naming it
    config = GatewayConfig(triton_url="127.0.0.1:8001", policy="hopper")   # from Python

The rollout's and gate's part (`--rollout`, `--gate-*`) is `bridge.gateway.rollout.config`'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bridge.common.kv import split_pair
from bridge.gate import GateConfig
from bridge.gateway.rollout.config import RolloutPlan
from bridge.gateway.rollout.config import add_arguments as add_rollout_arguments
from bridge.gateway.rollout.config import from_arguments as rollout_settings
from bridge.gateway.session.limits import Limits
from bridge.gateway.versions.publisher import PublishLimits
from bridge.security.hosts import allowed_host
from inference_server.repository import VERSIONS_SUFFIX
from inference_server.secret import read_secret

__all__ = ["GatewayConfig", "add_arguments", "from_arguments"]


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    triton_url: str
    policy: str = ""                 # default policy for sessions that name none
    host: str = "127.0.0.1"
    port: int = 0                    # 0 = a free port
    deadline_ms: int = 100           # per-step inference deadline
    max_batch: int = 64
    max_inflight: int = 1            # concurrent Triton batches per policy version (1 = biggest batches)
    batch_order: str = "deadline"    # queued requests leave earliest deadline first, or "arrival" (FIFO)
    decode_threads: int = 2          # threads decoding camera frames (JPEG, PNG): bridge.gateway.session.images
    triton_timeout_s: float = 10.0   # how long start() waits for Triton to be ready
    model_repository: Path | None = None  # Triton's repository (same host): needed to publish versions
    experience_dir: Path | None = None    # the experience log; None = no logging
    fsync_interval_ms: float = 5.0        # group commit: the longest a transition waits to be on disk
    log_max_pending: int = 100_000        # the log's bound: transitions not yet on disk (bridge.experience.log)
    log_max_pending_mb: float = 1024.0    # ... and their serialized size; beyond either, LogFull
    log_retention_mb: float | None = None     # delete finished segments, oldest first, past this total; None = keep
    log_retention_hours: float | None = None  # ... and those last written longer ago than this; None = keep
    experience_url: str = ""              # nats://H:P[,...]: to NATS JetStream (beside or instead of the dir)
    nats_user: str = ""                   # its credentials (bridge.experience.jetstream.NatsAuth): user, the
    nats_password_file: Path | None = None  # 0600 file holding its password, the CA verifying the servers (TLS)
    nats_ca: Path | None = None
    rewards: Mapping[str, Path] = field(default_factory=dict)  # policy -> reward config YAML
    switch: str = "episode"          # when sessions move to a new version: "episode" or "step"
    rollout: RolloutPlan = field(default_factory=RolloutPlan)  # direct, or staged shadow -> canary -> live
    registry: Path | None = None     # default: <model_repository>/.tether/registry.sqlite; no repository: in memory
    #                                  (e-stops then go to <experience_dir>/.tether/estops.sqlite: session.holds)
    gate: GateConfig = field(default_factory=GateConfig)  # what a candidate version must pass (bridge.gate)
    # bridge.security: TLS (mTLS with tls_client_ca), the --insecure rule, tokens; bridge.gateway.session.limits
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
    # several Triton replicas (triton_url "A,B"; bridge.gateway.replicas.pool): replica i's model repository (one given:
    # shared by all; model_repository is the first), and the artifact store every version is copied from
    model_repositories: tuple[Path, ...] = ()
    artifact_store: Path | None = None    # default: <model_repository>/.tether/artifacts
    gateway_id: str = ""             # this gateway's name in session ownership (session.owners); "" = HOST:PORT
    drain_grace_s: float = 0.2       # SIGTERM: NOT_SERVING this long before the streams end UNAVAILABLE (drain)
    persistent_versions: bool = False  # ONNX versions served by one persistent model per policy (no stub per version)
    triton_secret_file: Path | None = None  # the secret Triton checks, sent on every call (inference_server.secret)

    @property
    def nats_auth(self):
        """The NATS client credentials (`--nats-user/--nats-password-file/--nats-ca`) as a NatsAuth."""
        from bridge.experience.jetstream import NatsAuth

        return NatsAuth(user=self.nats_user, password_file=self.nats_password_file, ca=self.nats_ca)

    @property
    def triton_urls(self) -> tuple[str, ...]:
        """The Triton replicas' addresses (`triton_url` is one HOST:PORT or several, comma-separated)."""
        return tuple(u.strip() for u in self.triton_url.split(","))

    def __post_init__(self):
        urls = self.triton_urls
        if not all(urls) or len(set(urls)) != len(urls):
            raise ValueError(f"triton_url {self.triton_url!r} must be HOST:PORT or distinct HOST:PORT,HOST:PORT,...")
        if len(self.model_repositories) not in (0, 1, len(urls)):
            raise ValueError(f"{len(self.model_repositories)} model repositories for {len(urls)} Triton replicas: "
                             "give one (shared) or one per replica")
        if len(urls) > 1 and self.model_repository is None:
            raise ValueError("several Triton replicas need --model-repository (the versions they are given)")
        if self.persistent_versions and (len(urls) > 1 or self.model_repository is None):
            raise ValueError("--persistent-versions needs --model-repository (the version files it opens) and one "
                             "Triton (replicas load a stub per version)")
        if self.persistent_versions and self.policy.endswith(VERSIONS_SUFFIX):
            raise ValueError(f"policy {self.policy!r}: names ending with {VERSIONS_SUFFIX!r} are reserved for the "
                             "persistent models of --persistent-versions")
        if self.deadline_ms <= 0:
            raise ValueError(f"deadline_ms must be positive, got {self.deadline_ms}")
        if not 1 <= self.decode_threads <= 64:
            raise ValueError(f"decode_threads must be 1..64, got {self.decode_threads}")
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
        if self.experience_url:
            from bridge.experience.jetstream import parse_servers

            parse_servers(self.experience_url)  # ValueError naming a bad address
            _ = self.nats_auth  # ValueError naming a bad NATS user, or a user without a password file
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError(f"TLS needs both tls_cert and tls_key, got cert={self.tls_cert} key={self.tls_key}")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca (mTLS) needs tls_cert and tls_key")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The gateway's flags (`tether gateway`), read back by `from_arguments`."""
    p.add_argument("--triton", required=True, metavar="HOST:PORT[,HOST:PORT...]",
                   help="Triton gRPC address; several (comma-separated) are replicas serving the same versions, "
                        "each verified per version, batches to the least busy (docs/versions.md)")
    p.add_argument("--policy", default="", help="default policy (Triton model name)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (not loopback: needs TLS or --insecure)")
    p.add_argument("--port", type=int, default=50051, help="gRPC port (0 = a free one)")
    p.add_argument("--gateway-id", default="", metavar="NAME",
                   help="this gateway's name in session ownership and fencing, unique among the gateways sharing "
                        "a registry (default: HOST:PORT)")
    p.add_argument("--drain-grace-s", type=float, default=0.2,
                   help="on SIGTERM: health NOT_SERVING and no new sessions for this long, then every stream ends "
                        "UNAVAILABLE 'draining' (its client moves to another gateway and replays), then exit")
    p.add_argument("--deadline-ms", type=int, default=100, help="per-step inference deadline (Welcome.deadline_ms)")
    p.add_argument("--max-batch", type=int, default=64, help="the most rows in one Triton batch")
    p.add_argument("--triton-timeout", type=float, default=10.0, help="seconds to wait for Triton at start")
    p.add_argument("--max-inflight", type=int, default=1,
                   help="concurrent Triton batches per policy version (per replica)")
    p.add_argument("--batch-order", choices=("deadline", "arrival"), default="deadline",
                   help="which queued observations leave first: earliest deadline (Observation.deadline_ns) or "
                        "first come, first served")
    p.add_argument("--decode-threads", type=int, default=2,
                   help="threads decoding camera frames (JPEG, PNG tensors) into the policy's uint8 batch")
    p.add_argument("--model-repository", type=Path, metavar="PATH[,PATH...]",
                   help="Triton's model repository (to publish new versions); with several --triton replicas one "
                        "shared by all, or one per replica in the same order (versions copied from --artifact-store)")
    p.add_argument("--artifact-store", type=Path, help="several replicas: every version stored once by sha256 here "
                   "(default: <first model repository>/.tether/artifacts)")
    p.add_argument("--experience-dir", type=Path, help="log every transition here (MCAP segments); without a "
                   "registry file, operators' e-stops are kept here too (.tether/estops.sqlite)")
    p.add_argument("--experience", metavar="nats://HOST:PORT[,nats://HOST:PORT...]", default="",
                   help="stream every transition to NATS JetStream (the stream TETHER_EXPERIENCE, 3 replicas with 3 "
                        "or more servers; durable_through = acknowledged by the stream), beside or instead of "
                        "--experience-dir; archive it with `tether archive` (docs/operations.md)")
    from bridge.experience.jetstream import add_nats_arguments

    add_nats_arguments(p)
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
    p.add_argument("--persistent-versions", action="store_true",
                   help="serve the --policy's ONNX versions from one persistent Triton model, <policy>.versions, that "
                        "opens each version's policy.onnx at its first request (no new stub process per version: a "
                        "version loads in tens of ms; docs/versions.md); needs --model-repository, one Triton")
    add_rollout_arguments(p)
    p.add_argument("--console-port", type=int, help="serve the operator console and /metrics here (0 = a free port)")
    p.add_argument("--console-host", default="127.0.0.1", help="the console's bind address (not loopback: the "
                   "gateway needs --tokens or --tls-client-ca)")
    p.add_argument("--console-allowed-host", action="append", default=[], metavar="NAME[:PORT]",
                   type=_console_allowed_host, help="a Host name the console also answers to, e.g. behind a "
                   "proxy (repeatable); other Hosts get 421")
    s = p.add_argument_group("security and limits (bridge.security, bridge.gateway.session.limits)")
    s.add_argument("--tls-cert", type=Path, help="server certificate (PEM): serve gRPC over TLS")
    s.add_argument("--tls-key", type=Path, help="the server certificate's private key (PEM)")
    s.add_argument("--tls-client-ca", type=Path, help="require client certificates signed by this CA (mTLS)")
    s.add_argument("--triton-secret-file", type=Path, metavar="PATH",
                   help="a file holding the secret Triton's restricted protocols check (`tether triton "
                        "--triton-secret-file`): sent as header tether-triton-key on every Triton call")
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


def from_arguments(a: argparse.Namespace) -> GatewayConfig:
    """The GatewayConfig of parsed `add_arguments` flags; a bad value raises SystemExit naming it."""
    try:
        repositories = tuple(Path(p) for p in str(a.model_repository).split(",")) if a.model_repository else ()
        if a.triton_secret_file:
            read_secret(a.triton_secret_file)  # a missing or malformed file fails here, naming it (never the secret)
        return GatewayConfig(triton_url=a.triton, policy=a.policy, host=a.host, port=a.port,
                             deadline_ms=a.deadline_ms, max_batch=a.max_batch, max_inflight=a.max_inflight,
                             batch_order=a.batch_order, decode_threads=a.decode_threads,
                             triton_timeout_s=a.triton_timeout,
                             model_repository=repositories[0] if repositories else None,
                             model_repositories=repositories if len(repositories) > 1 else (),
                             artifact_store=a.artifact_store,
                             experience_dir=a.experience_dir, fsync_interval_ms=a.fsync_interval_ms,
                             experience_url=a.experience, nats_user=a.nats_user,
                             nats_password_file=a.nats_password_file, nats_ca=a.nats_ca,
                             log_max_pending=a.log_max_pending, log_max_pending_mb=a.log_max_pending_mb,
                             log_retention_mb=a.log_retention_mb, log_retention_hours=a.log_retention_hours,
                             rewards=_reward_configs(a.rewards), switch=a.switch, **_security_kwargs(a),
                             console_port=a.console_port, console_host=a.console_host,
                             console_allowed_hosts=tuple(a.console_allowed_host), gateway_id=a.gateway_id,
                             drain_grace_s=a.drain_grace_s, persistent_versions=a.persistent_versions,
                             triton_secret_file=a.triton_secret_file,
                             **rollout_settings(a))
    except ValueError as exc:
        raise SystemExit(f"tether gateway: {exc}") from None


def _console_allowed_host(value: str) -> str:
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


def _reward_configs(items: list[str]) -> dict[str, Path]:
    try:
        return {policy: Path(path) for policy, path in (split_pair(item, what="--rewards") for item in items)}
    except ValueError as exc:
        raise SystemExit(f"tether gateway: {exc} (POLICY=YAML)") from None
