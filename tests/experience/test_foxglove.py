"""`tether log export LOG OUT.mcap --format foxglove`: a real log with two 30 Hz cameras, read back with the mcap
reader and decoded with Foxglove's published schemas (foxglove-sdk's, and foxglove-schemas-protobuf's where
installed), never with Tether's own code."""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from mcap.reader import make_reader
from PIL import Image

from bridge.experience import ExperienceLog
from bridge.experience.foxglove import LAYOUT
from bridge.experience.tool import main
from protos import bridge_pb2, codec, experience_pb2
from protos.timing import HOPS, gateway_hops

T0 = 1_764_720_000_000_000_000  # ns, the first step's gateway receive time
PERIOD = 33_333_333              # 30 Hz
SESSION = "arm_1"


def frame(step: int, h: int = 48, w: int = 64) -> np.ndarray:
    """A smooth image (JPEG keeps it within a few levels), different at every step."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x * 4 + step) % 256, (y * 5) % 256, np.full_like(x, step * 7 % 256)], -1).astype(np.uint8)


def step(i: int, *, episode: int, first: bool, last: bool, version: int, intervention: bool = False,
         estop: str = "") -> experience_pb2.Transition:
    rng = np.random.default_rng(i)
    recv = T0 + i * PERIOD
    timing = bridge_pb2.Timing(t_sent_ns=recv - 400_000, gateway_recv_ns=recv, infer_start_ns=recv + 20_000,
                               batch_start_ns=recv + 50_000, triton_start_ns=recv + 60_000,
                               triton_end_ns=recv + 900_000, infer_end_ns=recv + 910_000,
                               gateway_send_ns=recv + 950_000)
    top = codec.encode_image("top", frame(i))                       # a JPEG from the camera: passes through
    front = codec.encode("front", frame(i + 100))                   # a raw frame: the export encodes it
    obs = [codec.encode("joint_pos", rng.standard_normal(6).astype(np.float32)), top, front]
    act = [codec.encode("action", rng.uniform(-1, 1, 6).astype(np.float32))]
    applied = [codec.encode("action", np.clip(codec.decode(act[0]), -0.5, 0.5))]
    t = experience_pb2.Transition(
        session=SESSION, episode=episode, step=i, step_type=bridge_pb2.FIRST if first else bridge_pb2.MID,
        observation=obs, action=act, applied_action=applied, reward=0.25 * i, reward_terms={"alive": 0.25 * i},
        terminated=last, policy="arm", policy_version=version, timing=timing, source="test",
        intervention=intervention, guard=bridge_pb2.GuardReport(gateway_estop=estop, estopped=bool(estop)))
    return t


def make_log(log_dir) -> list[experience_pb2.Transition]:
    """Episode 0: steps 0-29 by v1 (a person acts at 10-12); episode 1: steps 30-59 by v2, an e-stop at 50-52, and a
    NaN observation at step 45 (unusable: skipped)."""
    items = []
    for i in range(60):
        episode = i // 30
        t = step(i, episode=episode, first=i % 30 == 0, last=i % 30 == 29, version=1 + episode,
                 intervention=10 <= i <= 12, estop="es-1" if 50 <= i <= 52 else "")
        items.append(t)
    items[45].observation[0].CopyFrom(codec.encode("joint_pos", np.full(6, np.nan, np.float32)))

    async def write():
        async with ExperienceLog(log_dir, segment_bytes=64 << 10) as log:
            await asyncio.gather(*(log.append(t) for t in items))

    asyncio.run(write())
    return items


def message_classes(summary) -> dict[int, type]:
    """schema id -> a message class for the protobuf schemas, built only from the file's own schema bytes."""
    out = {}
    for sid, schema in summary.schemas.items():
        if schema.encoding == "protobuf":
            pool = descriptor_pool.DescriptorPool()
            for fd in descriptor_pb2.FileDescriptorSet.FromString(schema.data).file:
                pool.Add(fd)
            out[sid] = message_factory.GetMessageClass(pool.FindMessageTypeByName(schema.name))
    return out


def read(path):
    with open(path, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        classes = message_classes(summary)
        got = []
        for schema, channel, m in reader.iter_messages(log_time_order=True):
            decoded = classes[schema.id].FromString(m.data) if schema.encoding == "protobuf" else json.loads(m.data)
            got.append((channel.topic, m.log_time, m.publish_time, decoded))
        assert summary.statistics.message_count == len(got)
    return summary, got


def test_the_export_decodes_with_foxglove_schemas_and_holds_the_log(tmp_path, capsys):
    import foxglove.messages as fm

    items = make_log(tmp_path / "log")
    out = tmp_path / "out" / "run.mcap"
    main(["export", str(tmp_path / "log"), str(out), "--format", "foxglove"])
    assert "wrote 2 episodes, 59 frames" in capsys.readouterr().out
    assert not list(out.parent.glob(".run.mcap.*"))  # the staged temp file was renamed, nothing left over

    summary, got = read(out)
    by_topic: dict[str, list] = {}
    for topic, log_time, pub, msg in got:
        by_topic.setdefault(topic, []).append((log_time, pub, msg))
    base = f"/{SESSION}"
    assert set(by_topic) == {"/log", f"{base}/camera/top", f"{base}/camera/front", f"{base}/state",
                             f"{base}/action", f"{base}/hops", f"{base}/estop"}
    kept = [t for t in items if t.step != 45]
    assert all(len(by_topic[f"{base}/{k}"]) == 59 for k in ("camera/top", "camera/front", "state", "action", "hops"))

    # the schemas in the file are Foxglove's own (the SDK's bytes; the published package's message descriptors)
    schemas = {s.name: s for s in summary.schemas.values()}
    assert schemas["foxglove.CompressedImage"].data == fm.CompressedImage.get_schema().data
    assert schemas["foxglove.Log"].data == fm.Log.get_schema().data
    published = pytest.importorskip("foxglove_schemas_protobuf", reason="foxglove-schemas-protobuf not installed")
    from foxglove_schemas_protobuf.CompressedImage_pb2 import CompressedImage
    from foxglove_schemas_protobuf.Log_pb2 import Log

    for kind in (CompressedImage, Log):
        fds = descriptor_pb2.FileDescriptorSet.FromString(schemas[kind.DESCRIPTOR.full_name].data)
        ours = next(m for f in fds.file for m in f.message_type if m.name == kind.DESCRIPTOR.name)
        theirs = descriptor_pb2.DescriptorProto()
        kind.DESCRIPTOR.CopyToProto(theirs)
        assert [(f.name, f.number, f.type) for f in ours.field] == [(f.name, f.number, f.type) for f in theirs.field]
    assert published is not None

    # cameras at 30 Hz: the JPEG passes through byte for byte, the raw frame comes back as that image; log time is
    # the gateway's receive time, publish time the robot's send time
    for (log_time, pub, msg), t in zip(by_topic[f"{base}/camera/top"], kept, strict=True):
        image = CompressedImage.FromString(msg.SerializeToString())
        assert image.format == "jpeg" and image.data == t.observation[1].data
        assert log_time == t.timing.gateway_recv_ns and pub == t.timing.t_sent_ns
        assert image.timestamp.seconds * 10**9 + image.timestamp.nanos == log_time
    times = [log_time for log_time, _, _ in by_topic[f"{base}/camera/front"]]
    assert set(np.diff(times)) <= {PERIOD, 2 * PERIOD}  # 30 Hz, one step skipped
    for (_, _, msg), t in zip(by_topic[f"{base}/camera/front"], kept, strict=True):
        assert msg.format == "jpeg"
        decoded = np.asarray(Image.open(io.BytesIO(msg.data)))
        assert decoded.shape == (48, 64, 3)
        assert np.abs(decoded.astype(int) - codec.decode(t.observation[2]).astype(int)).mean() < 3

    # numeric channels hold the transition's tensors
    for (_, _, state), (_, _, action), (_, _, hops), t in zip(
            by_topic[f"{base}/state"], by_topic[f"{base}/action"], by_topic[f"{base}/hops"], kept, strict=True):
        assert state["step"] == t.step and set(state["observation"]) == {"joint_pos"}
        np.testing.assert_array_equal(np.float32(state["observation"]["joint_pos"]),
                                      codec.decode(t.observation[0]))
        np.testing.assert_array_equal(np.float32(action["action"]["action"]), codec.decode(t.action[0]))
        np.testing.assert_array_equal(np.float32(action["applied_action"]["action"]),
                                      codec.decode(t.applied_action[0]))
        assert (action["reward"], action["policy_version"], action["intervention"]) == \
            (t.reward, t.policy_version, t.intervention)
        assert hops == {"step": t.step, "observation_age_ms": 0.4, "checks_ms": 0.02, "queue_ms": 0.03,
                        "batch_ms": 0.01, "triton_ms": 0.84, "respond_ms": 0.05, "gateway_ms": 0.95}
    estops = [(m["estopped"], m["estop_id"]) for _, _, m in by_topic[f"{base}/estop"]]
    assert estops == [(False, ""), (True, "es-1"), (False, "")]

    # the log: episode boundaries, the version change, the person's takeover, the e-stop
    logs = [(log_time, m.message, m.level, m.name) for log_time, _, m in by_topic["/log"]]
    assert all(name == SESSION for *_, name in logs)
    texts = [text for _, text, _, _ in logs]
    assert texts == ["episode 0 started at step 0", "policy arm v1 acts", "a person took over at step 10",
                     "the policy acts again at step 13", "episode 0 terminated after 30 steps, return 108.750",
                     "episode 1 started at step 30", "policy arm v1 -> arm v2",
                     "e-stop latched (es-1) by the gateway at the edge", "e-stop released",
                     "episode 1 terminated after 29 steps, return 322.500"]
    assert logs[4][0] == T0 + 29 * PERIOD and logs[5][0] == T0 + 30 * PERIOD
    assert {level for _, text, level, _ in logs if "e-stop latched" in text} == {Log.ERROR}


def test_the_summary_counts_skips_messages_and_writes_a_layout(tmp_path):
    from bridge.experience.foxglove import export_foxglove
    from bridge.experience.selection import Selection

    make_log(tmp_path / "log")
    info = export_foxglove(tmp_path / "log", tmp_path / "run.mcap", selection=Selection(min_version=2))
    assert (info["total_episodes"], info["total_frames"]) == (1, 29)
    assert info["skipped"] == 1 and info["first_skipped"]["offset"] == 45
    assert "NaN" in info["first_skipped"]["problem"] or "finite" in info["first_skipped"]["problem"]
    assert info["messages"][f"/{SESSION}/camera/top"] == 29 and info["messages"]["/log"] == 5
    assert info["cameras"] == {SESSION: ["top", "front"]}
    layout = json.loads((tmp_path / "run.mcap.layout.json").read_text())
    assert info["layout"] == str(tmp_path / "run.mcap.layout.json") and str(LAYOUT) in info["layout_note"]
    topics = json.dumps(layout["configById"])
    assert f"/{SESSION}/camera/top" in topics and f"/{SESSION}/hops.triton_ms" in topics and "SESSION" not in topics
    with pytest.raises(FileExistsError):  # never over an existing file
        export_foxglove(tmp_path / "log", tmp_path / "run.mcap", selection=Selection())


def test_hops_are_the_gateway_metrics_hops():
    import bridge.metrics

    t = step(3, episode=0, first=False, last=False, version=1).timing
    assert bridge.metrics.gateway_hops is gateway_hops and bridge.metrics.HOPS is HOPS  # one definition: protos.timing
    hops = dict(zip(HOPS, gateway_hops(t), strict=True))
    assert hops["gateway"] == t.gateway_send_ns - t.gateway_recv_ns and hops["reply"] is None
    t.triton_end_ns = 0
    assert dict(zip(HOPS, gateway_hops(t), strict=True))["triton"] is None
