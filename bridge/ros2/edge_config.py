"""The edge node's settings: how it talks to the gateway (`EdgeConfig`) and the safety guard's
limits for a topic map's commands (`guard_config`). A bad setting fails here, named, before any
topic or socket is opened:

    >>> tmap = load_topic_map(DEFAULT_TOPIC_MAP)
    >>> cfg = guard_config(tmap, deadline_s=0.05, max_delta=0.1, safe_action="zero")
    >>> cfg.size, cfg.position_high[2], cfg.max_delta[0], cfg.deadline_s
    (6, 3.1416, 0.1, 0.05)
    >>> cfg.velocity_limit                      # the topic map's, per joint (rate limits are always on)
    (1.0, 1.0, 1.5, 2.0, 2.0, 2.0)
    >>> guard_config(tmap, deadline_s=0.05, velocity_limit=3.0).velocity_limit[:2]   # a flag overrides
    (3.0, 3.0)
    >>> EdgeConfig(gateway="127.0.0.1:50051", chunk=10).chunk_threshold           # default: half
    5
    >>> EdgeConfig(gateway="10.0.0.5:50051,10.0.0.6:50051").gateways              # failover, in order
    ('10.0.0.5:50051', '10.0.0.6:50051')
    >>> EdgeConfig(gateway="127.0.0.1:50051", rate_hz=0)
    Traceback (most recent call last):
    ...
    bridge.ros2.edge_config.EdgeConfigError: rate_hz: expected a number of Hz in (0, 2000], got 0
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from bridge.client.channel import Credentials
from bridge.client.chunks import MERGES, ChunkConfig
from bridge.ros2 import messages
from bridge.ros2.estop import RELEASE_TOPIC, STATE_TOPIC
from bridge.ros2.guard import GuardConfig
from bridge.ros2.topic_map import DEFAULT_TOPIC_MAP, TopicMap, load_topic_map  # noqa: F401
from bridge.ros2.transport import TransportError, ros_topic

__all__ = ["DEFAULT_VELOCITY_LIMIT", "EdgeConfig", "EdgeConfigError", "default_latch_file", "guard_config",
           "unmeasured_commands"]

DEFAULT_VELOCITY_LIMIT = 0.5   # units/s (rad/s for joint targets) where the topic map sets none


class EdgeConfigError(ValueError):
    """An edge-node setting that cannot work; the message names the setting and its value."""


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise EdgeConfigError(f"{name}: expected a finite number of seconds > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class EdgeConfig:
    """How the node talks to the gateway and how often; the guard's limits are a `GuardConfig`."""

    gateway: str                               # HOST:PORT of the gateway; "A,B": a list, failover in order
    rate_hz: float = 100.0                     # control rate: observations, guard ticks
    policy: str = ""                           # Triton model; "" = the gateway's default
    node_name: str = "tether_edge"
    release_topic: str = RELEASE_TOPIC         # std_msgs/String operator name: releases the e-stop
    state_topic: str = STATE_TOPIC             # std_msgs/Bool: the node's e-stop latch
    stale_after_s: float = 0.5                 # older observation messages are not sent
    reply_timeout_s: float = 1.0               # no reply for this long: the stream is reset
    connect_timeout_s: float = 2.0
    backoff_s: tuple[float, float] = (0.1, 2.0)  # reconnect delay: initial, doubling up to max
    chunk: int = 0                             # 0: one action per reply; H: chunks of H actions
    chunk_threshold: int | None = None         # ask for the next chunk with this many left (H // 2)
    chunk_merge: str = "newest"                # overlapping chunks: newest | ensemble (ACT)
    ensemble_decay: float = 0.01               # ensemble weight exp(-decay * i), i = 0 the oldest
    chunk_prefix: bool = False                 # send action_prefix/action_delay (a policy that inpaints them)
    chunk_blend: int | None = None             # seam window in ticks (None: 0 with chunk_prefix, else H // 4)
    tls_ca: Path | None = None                 # TLS to the gateway: the CA of its certificate
    tls_cert: Path | None = None               # mTLS: this robot's certificate (its identity, OU=robot)
    tls_key: Path | None = None                # ... and its private key
    token: str | None = field(default=None, repr=False)  # a robot token NAME.SECRET (tether token add NAME
                                               # --role robot) for a gateway that checks tokens; in plaintext
                                               # only to a loopback gateway
    session_id: str = ""                       # stable across restarts; "" = "<node_name>@<host name>"
    latch_file: Path | None = None             # the guard's e-stop latch, kept across restarts (fsynced);
                                               # None = in memory only (`tether edge`: default_latch_file)
    release_tokens: Path | None = None         # hashed release credentials (bridge.ros2.estop); None: every
                                               # local release is refused

    def chunking(self) -> ChunkConfig | None:
        """The chunk loop's settings (`bridge.client.chunks`), None without chunks."""
        if not self.chunk:
            return None
        return ChunkConfig(horizon=self.chunk, threshold=self.chunk_threshold, merge=self.chunk_merge,
                           decay=self.ensemble_decay, prefix=self.chunk_prefix, blend=self.chunk_blend)

    def __post_init__(self) -> None:
        chunk = self.chunk
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 0 <= chunk <= 10_000:
            raise EdgeConfigError(f"chunk: expected 0 (no chunks) or a horizon H in [1, 10000], got {chunk!r}")
        threshold = self.chunk_threshold
        if threshold is None:
            object.__setattr__(self, "chunk_threshold", chunk // 2)
        elif isinstance(threshold, bool) or not isinstance(threshold, int) or not 0 <= threshold < max(chunk, 1):
            raise EdgeConfigError(f"chunk_threshold: expected an integer in [0, {max(chunk - 1, 0)}] "
                                  f"(actions left when the next chunk is requested), got {threshold!r}")
        if self.chunk_merge not in MERGES:
            raise EdgeConfigError(f"chunk_merge: expected one of {list(MERGES)}, got {self.chunk_merge!r}")
        decay = self.ensemble_decay
        if isinstance(decay, bool) or not isinstance(decay, int | float) or not math.isfinite(decay) or decay < 0:
            raise EdgeConfigError(f"ensemble_decay: expected a finite number >= 0, got {decay!r}")
        try:                           # the prefix and the seam window, checked as the chunk loop takes them
            self.chunking()
        except ValueError as exc:
            raise EdgeConfigError(str(exc)) from None
        rate = self.rate_hz
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 2000:
            raise EdgeConfigError(f"rate_hz: expected a number of Hz in (0, 2000], got {rate!r}")
        if not isinstance(self.gateway, str) or not all(a.rpartition(":")[2].isdigit()
                                                        for a in self.gateway.split(",")):
            raise EdgeConfigError(f"gateway: expected HOST:PORT, got {self.gateway!r} (several: HOST:PORT,HOST:PORT)")
        if not isinstance(self.node_name, str) or not self.node_name.isidentifier():
            raise EdgeConfigError(f"node_name: expected a ROS 2 node name, got {self.node_name!r}")
        for name in ("stale_after_s", "reply_timeout_s", "connect_timeout_s"):
            _seconds(name, getattr(self, name))
        for name in ("release_topic", "state_topic"):
            try:
                ros_topic(getattr(self, name))
            except TransportError as exc:
                raise EdgeConfigError(f"{name}: {exc}") from None
        if (self.tls_cert is None) != (self.tls_key is None) or (self.tls_cert is not None and self.tls_ca is None):
            raise EdgeConfigError(f"tls: a client certificate needs tls_cert, tls_key and tls_ca, got "
                                  f"cert={self.tls_cert} key={self.tls_key} ca={self.tls_ca}")
        if self.token is not None:
            if not isinstance(self.token, str) or not self.token.isprintable() or "." not in self.token:
                raise EdgeConfigError("token: expected NAME.SECRET (tether token add NAME --role robot)")
            try:                                   # the loopback rule, as every client has it (bridge.client)
                for address in self.gateways:
                    Credentials(token=self.token, ca=self.tls_ca).check(address)
            except ValueError as exc:
                raise EdgeConfigError(f"token: {exc}") from None
        for name in ("tls_ca", "tls_cert", "tls_key", "release_tokens"):
            if getattr(self, name) is not None and not Path(getattr(self, name)).is_file():
                raise EdgeConfigError(f"{name}: no such file {getattr(self, name)}")
        sid = self.session_id or f"{self.node_name}@{socket.gethostname()}"
        if not isinstance(sid, str) or len(sid) > 128 or not sid.isprintable() or any(c.isspace() for c in sid):
            raise EdgeConfigError(f"session_id: expected up to 128 printable characters without spaces, got {sid!r}")
        object.__setattr__(self, "session_id", sid)
        if self.latch_file is not None:
            latch = Path(self.latch_file)
            if latch.is_dir():
                raise EdgeConfigError(f"latch_file: {latch} is a directory, expected a file path")
            object.__setattr__(self, "latch_file", latch)

    @property
    def gateways(self) -> tuple[str, ...]:
        """The gateway addresses, in failover order."""
        return tuple(a.strip() for a in self.gateway.split(","))

    def credentials(self) -> Credentials:
        """TLS (mTLS with a certificate) and the robot token, for `bridge.client`'s channels."""
        return Credentials(ca=self.tls_ca, cert=self.tls_cert, key=self.tls_key, token=self.token)


def guard_config(topic_map: TopicMap, *, deadline_s: float, velocity_limit: object = None,
                 max_delta: object = None, safe_action: object = "hold") -> GuardConfig:
    """The guard for the topic map's action tensors, concatenated in spec order; the position
    limits are the topic map's bounds, which every action tensor must declare. Rate limits are
    always on: `velocity_limit` (one value or one per element) overrides the topic map's, which
    default to `DEFAULT_VELOCITY_LIMIT` (pass `math.inf` to turn them off, knowingly)."""
    low: list[float] = []
    high: list[float] = []
    for spec in topic_map.action_specs():
        n = math.prod(spec.shape)
        if not spec.low:
            raise EdgeConfigError(f"action tensor {spec.name!r} has no bounds in the topic map: "
                                  "the safety guard needs limits for every command")
        if len(spec.low) not in (1, n):
            raise EdgeConfigError(f"action tensor {spec.name!r}: {len(spec.low)} bounds for {n} values")
        low += list(spec.low) * (n if len(spec.low) == 1 else 1)
        high += list(spec.high) * (n if len(spec.high) == 1 else 1)
    if velocity_limit is None:
        velocity_limit = topic_map.velocity_limits(DEFAULT_VELOCITY_LIMIT)
    return GuardConfig(position_low=tuple(low), position_high=tuple(high), velocity_limit=velocity_limit,
                       max_delta=max_delta, deadline_s=deadline_s, safe_action=safe_action)


def default_latch_file(node_name: str) -> Path:
    """Where `tether edge` keeps a node's e-stop latch: `$XDG_STATE_HOME/tether/<node_name>.json`
    (`~/.local/state/tether/...` without it)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "tether" / f"{node_name}.json"


def unmeasured_commands(topic_map: TopicMap) -> list[str]:
    """The action entries whose command the node cannot read from the robot's measured pose, each
    with why ([] = every element's first command can start from where the robot is). The first
    command of such an entry could only be clamped, a jump from wherever the actuator is; the node
    refuses to start with one.

        >>> unmeasured_commands(load_topic_map(DEFAULT_TOPIC_MAP))
        []
    """
    measured = {j for e in topic_map.observation if e.type == messages.JOINT_STATE for j in e.joints}
    out: list[str] = []
    for i, entry in enumerate(topic_map.action):
        what = f"action[{i}] ({entry.topic}, tensors {[t.spec.name for t in entry.tensors]})"
        if not entry.joints:
            out.append(f"{what}: no joints, so no measured pose to start from")
        elif missing := [j for j in entry.joints if j not in measured]:
            out.append(f"{what}: joints {missing} are in no {messages.JOINT_STATE} observation")
        elif bad := [t.spec.name for t in entry.tensors if t.spec.shape != (len(entry.joints),)]:
            out.append(f"{what}: tensors {bad} are not one value per joint ({len(entry.joints)})")
    return out
