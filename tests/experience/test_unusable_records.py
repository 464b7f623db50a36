"""Records a reader cannot use, written straight into a real log segment (as a bug, a disk or an older
gateway could leave them): the log reader, `tether log export`, BC's LogDataset and PPO's StreamSource
each skip and count them and go on, instead of crashing at the same record on every resume."""

from __future__ import annotations

import json
import time

import numpy as np
import torch

from bridge.experience.reader import read_transitions
from bridge.experience.segment import SegmentWriter, segment_name
from bridge.experience.tool import export, inspect, main
from protos import codec, experience_pb2
from protos.codec import Spec
from tests.experience.helpers import transition
from tests.trainer.standin import StandIn
from trainer.bc import BCConfig, BCLearner
from trainer.policy import MLPPolicy
from trainer.sources import LogDataset, StreamSource


def poisoned() -> list[tuple[int, str, experience_pb2.Transition | bytes]]:
    """(offset, what, record): a 9-step episode of session "s" with five unusable records in it."""
    records: list = []
    for step in range(9):
        t = transition("s", step, last=step == 8)
        what = "good"
        if step == 2:
            t.action[0].data = np.array([0.0, np.nan, 1.0], np.float32).tobytes()
            what = "nan action"
        elif step == 3:
            t.observation[0].data = b"\x00\x01\x02"
            what = "malformed tensor"
        elif step == 4:
            t = b"\xff\xff\xff\xff\xff"  # not a Transition at all
            what = "garbage"
        elif step == 5:
            t.reward = float("inf")
            what = "infinite reward"
        elif step == 6:
            t.observation[0].CopyFrom(codec.encode("observation", np.zeros(5, np.float32)))
            what = "misshapen observation"
        if not isinstance(t, bytes):
            t.offset = step
        records.append((step, what, t))
    return records


def write_log(directory) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    writer = SegmentWriter.create(directory / segment_name(1), first_offset=0)
    writer.append_many([(1_000 + i, r if isinstance(r, bytes) else r.SerializeToString())
                        for i, _, r in poisoned()])
    writer.finish({"s": 8})


GOOD = [0, 1, 7, 8]
UNUSABLE = 5


def test_the_log_reader_skips_and_counts_what_is_not_a_transition(tmp_path):
    write_log(tmp_path / "log")
    skipped: list[tuple[int, str]] = []
    offsets = [t.offset for t in read_transitions(tmp_path / "log", on_skip=lambda o, why: skipped.append((o, why)))]
    assert offsets == [0, 1, 2, 3, 5, 6, 7, 8]       # parsed: usable or not is each reader's own check
    assert len(skipped) == 1 and skipped[0][0] == 4 and "does not parse" in skipped[0][1]


def test_log_export_and_inspect_skip_and_count_unusable_records(tmp_path, capsys):
    write_log(tmp_path / "log")
    info = export(tmp_path / "log", tmp_path / "out")
    assert info["skipped"] == UNUSABLE and info["total_frames"] == len(GOOD) and info["transitions_read"] == len(GOOD)
    assert info["first_skipped"]["offset"] == 2 and "NaN" in info["first_skipped"]["problem"]
    episode = np.load(tmp_path / "out" / "data" / "chunk-000" / "episode_000000.npz")
    assert episode["offset"].tolist() == GOOD and np.isfinite(episode["action.action"]).all()
    assert json.loads((tmp_path / "out" / "meta" / "info.json").read_text())["skipped"] == UNUSABLE
    summary = inspect(tmp_path / "log")
    assert summary["transitions"] == len(GOOD) and summary["skipped"] == UNUSABLE
    assert np.isfinite(summary["returns"]["mean"])
    main(["export", str(tmp_path / "log"), str(tmp_path / "again")])   # the command a user runs
    assert f"{UNUSABLE} unusable record(s) skipped, first at offset 2" in capsys.readouterr().out


def test_bc_reads_past_unusable_records_and_learns(tmp_path):
    write_log(tmp_path / "log")
    dataset = LogDataset(tmp_path / "log", seed=0)
    assert [t.offset for t in dataset.transitions] == GOOD and dataset.skipped == UNUSABLE
    torch.manual_seed(0)
    learner = BCLearner(MLPPolicy(Spec("observation", np.float32, (11,)), Spec("action", np.float32, (3,)), seed=0),
                        config=BCConfig(lr=1e-2))
    losses = [learner.update(next(dataset.batches(4, epoch=e)))["loss"] for e in range(5)]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_ppos_stream_source_skips_and_counts_unusable_transitions():
    obs, act = Spec("observation", np.float32, (11,)), Spec("action", np.float32, (3,))
    with StandIn(obs, act, policy="pi") as gw:
        for _, _, record in poisoned():
            if not isinstance(record, bytes):  # the stream carries parsed transitions: all but the garbage
                gw.append(record)
        with StreamSource(gw.address, policy="pi", expect=(obs, act)) as source:
            got: list = []
            deadline = time.monotonic() + 20
            while source.next_offset < 8 and time.monotonic() < deadline:
                got += source.poll(timeout=0.2)
            got += source.poll(timeout=0.2)
            assert [t.step for t in got] == GOOD and source.skipped == UNUSABLE - 1


def test_the_gates_recorded_observations_leave_out_non_finite_ones(tmp_path):
    from bridge.gate.samples import recent_observations

    records = []
    for step in range(6):
        t = transition("s", step)
        if step in (2, 4):
            t.observation[0].data = np.full(11, np.nan if step == 2 else np.inf, np.float32).tobytes()
        t.offset = step
        records.append(t)
    (tmp_path / "log").mkdir()
    writer = SegmentWriter.create(tmp_path / "log" / segment_name(1), first_offset=0)
    writer.append_many([(1_000 + t.offset, t.SerializeToString()) for t in records])
    writer.finish({"s": 5})
    batch = recent_observations(tmp_path / "log", policy="pi", inputs=(Spec("observation", np.float32, (11,)),),
                                count=10)
    assert [key[2] for key in batch.keys] == [0, 1, 3, 5] and np.isfinite(batch.inputs["observation"]).all()
