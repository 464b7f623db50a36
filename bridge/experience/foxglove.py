"""Transitions as Foxglove messages: one translator for the file export and the live view (bridge.view).

    tether log export runs/demo out/run.mcap --format foxglove      # export_foxglove: an MCAP file to open
    translator = Translator()
    for t in transitions:                                            # a session's steps, in order
        for m in translator.translate(t):                           # Message(topic, log_time_ns, data)
            ...

Topics, per session (the robot), with their encoding and schema:
- `/<session>/camera/<name>` (protobuf `foxglove.CompressedImage`): a camera observation; JPEG/PNG tensors pass
  through as logged, a raw uint8 (H, W, 1|3) frame is JPEG-encoded.
- `/<session>/state` (json, JSON schema `tether.State`): `{"step", "episode", "observation": {name: [numbers]}}`,
  every non-camera observation tensor flattened.
- `/<session>/action` (json, `tether.Action`): `{"step", "episode", "policy", "policy_version", "action": {name:
  [...]}` (the policy's own), `"applied_action"` (what reached the actuators), `"intervention", "reward",
  "reward_terms", "env_reward", "terminated", "truncated"}`.
- `/<session>/hops` (json, `tether.Hops`): `{"step", "<hop>_ms": ...}`, the latency budget's hops the gateway
  knows (protos.timing.gateway_hops).
- `/<session>/estop` (json, `tether.EStop`): `{"estopped", "edge_estopped", "estop_id"}` when it changes (file:
  from the edge's guard report; live: from tether.v1.Fleet).
- `/log` (protobuf `foxglove.Log`, `name` = the session): episode starts and ends, policy version changes,
  interventions, e-stops.

Numeric channels are JSON (a JSON-schema channel of named arrays): Foxglove's Plot and Raw Message panels read
them as they are (`/arm_1/state.observation.joint_pos[2]`), whatever tensors a robot declares, with no schema
generated per robot. Each message's log time is the step's own: the gateway's receive time
(`timing.gateway_recv_ns`, wall clock; `t_sent_ns` where that is missing), its publish time the robot's send
time (`t_sent_ns`). `LAYOUT` (foxglove_layout.json) is a Foxglove layout for one robot (its cameras, state,
actions, rewards, hops and the log): `layout_for(session, cameras)` fills in a session's topics, and the
export writes one beside the file (`OUT.layout.json`: Foxglove's "Import layout").
"""

from __future__ import annotations

import base64
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bridge.common.files import staged_file, write_text
from bridge.experience.selection import Selection, Skips, logged_episodes
from protos import codec, experience_pb2, tensor_pb2
from protos.timing import HOPS, gateway_hops

__all__ = ["LAYOUT", "LOG_TOPIC", "Message", "Topic", "Translator", "camera_names", "export_foxglove", "layout_for"]

LOG_TOPIC = "/log"
LAYOUT = Path(__file__).with_name("foxglove_layout.json")
LAYOUT_SESSION = "SESSION"  # the placeholder session in LAYOUT's topics
JPEG_QUALITY = 90


@dataclass(frozen=True)
class Topic:
    """A channel: its topic, message encoding and schema (name, encoding, bytes)."""

    topic: str
    encoding: str             # "protobuf" or "json"
    schema_name: str
    schema_encoding: str      # "protobuf" (a FileDescriptorSet) or "jsonschema"
    schema: bytes

    def advertisement(self, channel_id: int) -> dict:
        """This channel in a Foxglove WebSocket `advertise` (binary schemas as base64)."""
        text = base64.b64encode(self.schema).decode() if self.schema_encoding == "protobuf" else self.schema.decode()
        return {"id": channel_id, "topic": self.topic, "encoding": self.encoding, "schemaName": self.schema_name,
                "schema": text, "schemaEncoding": self.schema_encoding}


@dataclass(frozen=True)
class Message:
    topic: Topic
    log_time_ns: int
    publish_time_ns: int
    data: bytes


def _foxglove_schema(kind) -> tuple[str, bytes]:
    schema = kind.get_schema()
    return schema.name, bytes(schema.data)


def _json_schema(title: str, properties: dict) -> bytes:
    return json.dumps({"title": title, "type": "object", "properties": properties}).encode()


_ARRAYS = {"type": "object", "additionalProperties": {"type": "array", "items": {"type": ["number", "null"]}}}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
JSON_SCHEMAS = {
    "state": ("tether.State", _json_schema("tether.State", {"step": _INT, "episode": _INT, "observation": _ARRAYS})),
    "action": ("tether.Action", _json_schema("tether.Action", {
        "step": _INT, "episode": _INT, "policy": {"type": "string"}, "policy_version": _INT, "action": _ARRAYS,
        "applied_action": _ARRAYS, "intervention": _BOOL, "reward": _NUM, "env_reward": _NUM,
        "reward_terms": {"type": "object", "additionalProperties": _NUM}, "terminated": _BOOL, "truncated": _BOOL})),
    "hops": ("tether.Hops", _json_schema("tether.Hops", {"step": _INT, **{f"{h}_ms": _NUM for h in HOPS}})),
    "estop": ("tether.EStop", _json_schema("tether.EStop", {"estopped": _BOOL, "edge_estopped": _BOOL,
                                                            "estop_id": {"type": "string"}})),
}


def _messages():
    import foxglove.messages  # foxglove-sdk: its schemas and encoders (protobuf)

    return foxglove.messages


def camera_names(observation: Iterable[tensor_pb2.Tensor]) -> list[str]:
    """The observation tensors shown as cameras: JPEG or PNG encoded, or raw uint8 (H, W, 1|3)."""
    return [x.name for x in observation if _is_camera(x)]


def _is_camera(x: tensor_pb2.Tensor) -> bool:
    if x.encoding != codec.RAW:
        return True
    return (x.dtype == tensor_pb2.UINT8 and len(x.shape) == 3
            and codec.image_shape_problem(np.dtype("u1"), tuple(x.shape)) is None)


def _arrays(tensors: Iterable[tensor_pb2.Tensor]) -> dict[str, list]:
    out = {}
    for x in tensors:
        values = codec.decode(x).astype(np.float64, copy=False).ravel().tolist()
        out[x.name] = [v if math.isfinite(v) else None for v in values]
    return out


def _json(value: dict) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


@dataclass
class _SessionState:
    episode: int | None = None
    steps: int = 0
    ret: float = 0.0
    version: tuple[str, int] | None = None
    intervening: bool = False
    estop: tuple[bool, bool, str] | None = None


@dataclass
class Translator:
    """Transitions -> Foxglove messages, remembering per session what the log messages need (episode, version,
    interventions, e-stops). `wanted(topic)`: only messages for topics it admits are made (the live view makes
    none for channels nobody watches; the topics are still learnt, see `topics`)."""

    wanted: Callable[[str], bool] = lambda topic: True
    estop_from_guard: bool = True     # the file's e-stop state: the edge's guard reports (live: `estop_state`)
    jpeg_quality: int = JPEG_QUALITY
    topics: dict[str, Topic] = field(default_factory=dict)   # every topic seen so far, by name
    sessions: dict[str, _SessionState] = field(default_factory=dict)

    def topic(self, name: str, kind: str) -> Topic:
        found = self.topics.get(name)
        if found is None:
            if kind == "camera":
                schema_name, schema = _foxglove_schema(_messages().CompressedImage)
                found = Topic(name, "protobuf", schema_name, "protobuf", schema)
            elif kind == "log":
                schema_name, schema = _foxglove_schema(_messages().Log)
                found = Topic(name, "protobuf", schema_name, "protobuf", schema)
            else:
                schema_name, schema = JSON_SCHEMAS[kind]
                found = Topic(name, "json", schema_name, "jsonschema", schema)
            self.topics[name] = found
        return found

    def session_topics(self, t: experience_pb2.Transition) -> list[Topic]:
        """The topics `t` publishes on (learnt into `topics`)."""
        base = f"/{t.session}"
        return [self.topic(LOG_TOPIC, "log"), *(self.topic(f"{base}/camera/{n}", "camera")
                                                for n in camera_names(t.observation)),
                *(self.topic(f"{base}/{kind}", kind) for kind in ("state", "action", "hops", "estop"))]

    def translate(self, t: experience_pb2.Transition) -> list[Message]:
        """The messages of one step (log messages first, then cameras, state, action, hops, e-stop state)."""
        self.session_topics(t)
        log_ns = t.timing.gateway_recv_ns or t.timing.t_sent_ns
        pub_ns = t.timing.t_sent_ns or log_ns
        base, s = f"/{t.session}", self.sessions.setdefault(t.session, _SessionState())
        out: list[Message] = []

        def put(topic: str, kind: str, make: Callable[[], bytes]) -> None:
            if self.wanted(topic):
                out.append(Message(self.topic(topic, kind), log_ns, pub_ns, make()))

        def log(level: str, text: str) -> None:
            put(LOG_TOPIC, "log", lambda: self.log_record(t.session, log_ns, level, text))

        if s.episode != t.episode:
            if s.episode is not None and s.steps:
                log("Info", f"episode {s.episode} left open after {s.steps} steps (return {s.ret:.3f})")
            s.episode, s.steps, s.ret = t.episode, 0, 0.0
            log("Info", f"episode {t.episode} started at step {t.step}")
        version = (t.policy, t.policy_version)
        if s.version != version:
            log("Info", f"policy {t.policy} v{t.policy_version} acts" if s.version is None else
                f"policy {s.version[0]} v{s.version[1]} -> {t.policy} v{t.policy_version}")
            s.version = version
        if t.intervention != s.intervening:
            log("Warning" if t.intervention else "Info",
                f"a person took over at step {t.step}" if t.intervention else f"the policy acts again at step {t.step}")
            s.intervening = t.intervention
        estop = (bool(t.guard.gateway_estop), bool(t.guard.estopped), t.guard.gateway_estop)
        if self.estop_from_guard and estop != s.estop:
            if s.estop is not None or any(estop[:2]):
                log("Error" if any(estop[:2]) else "Info", _estop_text(estop))
            s.estop = estop
            put(f"{base}/estop", "estop", lambda: _json({"estopped": estop[0], "edge_estopped": estop[1],
                                                         "estop_id": estop[2]}))
        for x in t.observation:
            if _is_camera(x):
                put(f"{base}/camera/{x.name}", "camera", lambda x=x: self.image(x, log_ns))
        put(f"{base}/state", "state", lambda: _json({"step": t.step, "episode": t.episode,
                                                      "observation": _arrays(x for x in t.observation
                                                                             if not _is_camera(x))}))
        put(f"{base}/action", "action", lambda: _json({
            "step": t.step, "episode": t.episode, "policy": t.policy, "policy_version": t.policy_version,
            "action": _arrays(t.action), "applied_action": _arrays(t.applied_action), "intervention": t.intervention,
            "reward": t.reward, "env_reward": t.env_reward, "reward_terms": dict(t.reward_terms),
            "terminated": t.terminated, "truncated": t.truncated}))
        put(f"{base}/hops", "hops", lambda: _json({"step": t.step, **{
            f"{hop}_ms": ns / 1e6 for hop, ns in zip(HOPS, gateway_hops(t.timing), strict=True) if ns is not None}}))
        s.steps += 1
        s.ret += t.reward
        if t.terminated or t.truncated:
            log("Info", f"episode {t.episode} {'terminated' if t.terminated else 'truncated'} after {s.steps} "
                f"steps, return {s.ret:.3f}")
            s.episode, s.steps, s.ret = None, 0, 0.0
        return out

    def estop_state(self, session: str, *, estopped: bool, edge_estopped: bool, estop_id: str, t_ns: int,
                    repeat: bool = False) -> list[Message]:
        """The live view's e-stop state of a session (tether.v1.Fleet), as messages when it changed; `repeat`: the
        state message at every call (the log line still only on a change), so that a viewer that lost a frame
        (a slow one's are dropped) shows the state again at the next poll."""
        s = self.sessions.setdefault(session, _SessionState())
        estop = (estopped, edge_estopped, estop_id)
        changed = estop != s.estop
        if not (changed or repeat):
            return []
        first, s.estop = s.estop is None, estop
        out = []
        topic = f"/{session}/estop"
        self.topic(topic, "estop")
        if self.wanted(topic):
            out.append(Message(self.topics[topic], t_ns, t_ns, _json({"estopped": estopped,
                                                                      "edge_estopped": edge_estopped,
                                                                      "estop_id": estop_id})))
        self.topic(LOG_TOPIC, "log")
        if changed and (not first or estopped or edge_estopped) and self.wanted(LOG_TOPIC):
            level = "Error" if estopped or edge_estopped else "Info"
            out.append(Message(self.topics[LOG_TOPIC], t_ns, t_ns,
                               self.log_record(session, t_ns, level, _estop_text(estop))))
        return out

    def image(self, x: tensor_pb2.Tensor, t_ns: int) -> bytes:
        m = _messages()
        if x.encoding in (codec.JPEG, codec.PNG):
            data, fmt = x.data, codec.encoding_name(x.encoding).lower()
        else:
            data, fmt = codec.encode_image(x.name, codec.decode(x), quality=self.jpeg_quality).data, "jpeg"
        return m.CompressedImage(timestamp=_stamp(t_ns), frame_id=x.name, data=bytes(data), format=fmt).encode()

    @staticmethod
    def log_record(session: str, t_ns: int, level: str, text: str) -> bytes:
        m = _messages()
        return m.Log(timestamp=_stamp(t_ns), level=getattr(m.LogLevel, level), message=text, name=session,
                     file="", line=0).encode()


def _estop_text(estop: tuple[bool, bool, str]) -> str:
    held, edge, ident = estop
    if held or edge:
        return "e-stop latched" + (f" ({ident})" if ident else "") + (" by the gateway" if held else "") + \
            (" at the edge" if edge else "")
    return "e-stop released"


def _stamp(t_ns: int):
    return _messages().Timestamp(sec=t_ns // 1_000_000_000, nsec=t_ns % 1_000_000_000)


def layout_for(session: str, cameras: Iterable[str] = ()) -> dict:
    """LAYOUT with its placeholder session replaced by `session`, and its image panels set to `cameras` (the
    template's two when none are given)."""
    text = LAYOUT.read_text().replace(f"/{LAYOUT_SESSION}/", f"/{session}/")
    layout = json.loads(text)
    cameras = list(cameras)
    images = sorted(k for k in layout["configById"] if k.startswith("Image!"))
    for key, name in zip(images, cameras, strict=False):
        layout["configById"][key]["imageMode"]["imageTopic"] = f"/{session}/camera/{name}"
    return layout


def export_foxglove(log_dir: Path, out_path: Path, *, selection: Selection) -> dict:
    """The log's selected episodes as one MCAP file at `out_path` (written to a temp file, then renamed) with
    Foxglove's schemas (module docstring), and `OUT.layout.json` (a layout for its first session). Returns
    totals: episodes, frames (steps), skipped records, messages per topic, sessions, cameras and the layout."""
    from mcap.writer import CompressionType, Writer

    try:
        _messages()
    except ImportError as exc:  # `tether log export` says so (a ValueError), never a traceback
        raise ValueError(f"--format foxglove needs foxglove-sdk ({exc.name} is not installed): "
                         f"pip install 'tether[interop]'") from None
    out_path = Path(out_path)
    translator = Translator()
    skips = Skips()
    per_topic: Counter[str] = Counter()
    episodes = frames = 0
    channels: dict[str, int] = {}
    cameras: dict[str, list[str]] = {}
    with staged_file(out_path) as tmp, open(tmp, "wb") as f:
        writer = Writer(f, compression=CompressionType.ZSTD)
        writer.start(profile="", library="tether log export --format foxglove")
        schemas: dict[str, int] = {}

        def channel(topic: Topic) -> int:
            if topic.topic not in channels:
                if topic.schema_name not in schemas:
                    schemas[topic.schema_name] = writer.register_schema(topic.schema_name, topic.schema_encoding,
                                                                        topic.schema)
                channels[topic.topic] = writer.register_channel(topic.topic, topic.encoding,
                                                                schemas[topic.schema_name])
            return channels[topic.topic]

        for ep in logged_episodes(log_dir, selection, skips):
            episodes += 1
            for t in ep.transitions:
                frames += 1
                cameras.setdefault(t.session, camera_names(t.observation))
                for m in translator.translate(t):
                    per_topic[m.topic.topic] += 1
                    writer.add_message(channel(m.topic), log_time=m.log_time_ns, publish_time=m.publish_time_ns,
                                       data=m.data, sequence=per_topic[m.topic.topic] & 0xFFFFFFFF)
        writer.finish()
    layout = None
    if cameras:
        session = next(iter(cameras))
        layout = out_path.with_name(out_path.name + ".layout.json")
        write_text(layout, json.dumps(layout_for(session, cameras[session]), indent=2) + "\n")
    return {"format": "foxglove (MCAP, Foxglove schemas)", "source": str(log_dir), "out": str(out_path),
            "total_episodes": episodes, "total_frames": frames, "skipped": skips.count,
            "first_skipped": skips.first, "messages": dict(sorted(per_topic.items())),
            "sessions": sorted(cameras), "cameras": cameras, "layout": str(layout) if layout else None,
            "layout_note": "open the .mcap in Foxglove, then Layouts > Import the .layout.json (a template for any "
                           f"robot: {LAYOUT})"}
