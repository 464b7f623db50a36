"""LogDataset over real MCAP files (torn tails, foreign channels, sharding) and StreamSource over
real gRPC on loopback (shards, acks and back-pressure, reconnect, refusal)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from mcap.writer import Writer

from protos import codec, experience_pb2
from protos.codec import Spec
from tests.trainer.standin import StandIn, shard_of
from trainer.sources import LogDataset, StreamError, StreamSource, read_segment, write_transitions

OBS, ACT = Spec("observation", np.float32, (4,)), Spec("action", np.float32, (1,))


def transition(i: int, session: str = "s") -> experience_pb2.Transition:
    return experience_pb2.Transition(offset=i, session=session, step=i, policy="p",
                                     observation=[codec.encode("observation", np.full(4, i, np.float32))],
                                     action=[codec.encode("action", np.full(1, i, np.float32))])


def test_log_dataset_shards_are_disjoint_equal_and_seeded(tmp_path):
    write_transitions(tmp_path / "a.mcap", [transition(i) for i in range(0, 60)])
    (tmp_path / "sub").mkdir()
    write_transitions(tmp_path / "sub" / "b.mcap", [transition(i) for i in range(60, 101)])
    ranks = [LogDataset(tmp_path, rank=r, world_size=2, seed=3) for r in range(2)]
    assert len(ranks[0]) == 101 and ranks[0].per_rank() == 50
    seen = [[t.offset for b in ds.batches(16, epoch=0) for t in b] for ds in ranks]
    assert len(seen[0]) == len(seen[1]) == 50 and not set(seen[0]) & set(seen[1])
    assert seen[0] == [t.offset for b in LogDataset(tmp_path, rank=0, world_size=2, seed=3).batches(7, epoch=0)
                       for t in b]  # same seed, same order, whatever the batch size
    assert seen[0] != [t.offset for b in ranks[0].batches(16, epoch=1) for t in b]  # reshuffled per epoch
    assert [t.offset for t in next(ranks[0].batches(5, epoch=0, start=10))] == seen[0][10:15]


def test_a_segment_being_written_is_read_up_to_its_last_complete_record(tmp_path):
    path = tmp_path / "seg.mcap"
    with open(path, "wb") as f:  # unchunked, flushed per message: the shape of a live segment
        writer = Writer(f, use_chunking=False)
        writer.start()
        schema = writer.register_schema("tether.v1.Transition", "protobuf", b"")
        channel = writer.register_channel("/t", "protobuf", schema)
        other = writer.register_channel("/other", "json", writer.register_schema("x.Other", "jsonschema", b"{}"))
        for i in range(10):
            writer.add_message(other, log_time=i, publish_time=i, data=b"{}")
            writer.add_message(channel, log_time=i, publish_time=i, data=transition(i).SerializeToString())
        f.flush()
        size = f.tell()
    full = read_segment(path)
    assert [t.offset for t in full] == list(range(10))  # no footer yet: still readable
    with open(path, "r+b") as f:
        f.truncate(size - 5)  # tear the last record
    torn = read_segment(path)
    assert [t.offset for t in torn] == list(range(9))


def test_log_dataset_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LogDataset(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no \\*.mcap segments"):
        LogDataset(tmp_path)
    write_transitions(tmp_path / "a.mcap", [transition(0)])
    with pytest.raises(ValueError, match="of policy 'q'"):
        LogDataset(tmp_path, policy="q")
    with pytest.raises(ValueError, match="rank 2"):
        LogDataset(tmp_path, rank=2, world_size=2)


def poll_until(source: StreamSource, n: int, *, deadline_s: float = 20.0) -> list[experience_pb2.Transition]:
    got: list[experience_pb2.Transition] = []
    deadline = time.monotonic() + deadline_s
    while len(got) < n and time.monotonic() < deadline:
        got += source.poll(timeout=0.2)
    return got


def test_stream_source_reads_its_shard_acks_and_reconnects():
    sessions = ["a", "b", "c", "d", "e", "f"]
    with StandIn(OBS, ACT, policy="p") as gw:
        for i in range(300):
            gw.append(transition(0, session=sessions[i % len(sessions)]))
        mine = [i for i in range(300) if shard_of(sessions[i % len(sessions)], 2) == 1]
        gw.fail_after_batches = 2  # the first stream is cut after two batches
        with StreamSource(gw.address, shard=1, num_shards=2, policy="p", max_batch=16, window=64,
                          backoff_s=(0.01, 0.1)) as source:
            got: list[experience_pb2.Transition] = []
            deadline = time.monotonic() + 20
            while len(got) < len(mine) and time.monotonic() < deadline:
                batch = source.poll(timeout=0.2)
                got += batch
                if batch:
                    source.ack(batch[-1].offset + 1)
            assert [t.offset for t in got] == mine  # exactly once, in order, across the reconnect
            assert source.reconnects >= 1
            assert gw.subscriptions[-1].from_offset > 0 and gw.subscriptions[-1].shard == 1


def test_stream_source_respects_the_window_until_acked():
    with StandIn(OBS, ACT, policy="p") as gw:
        for i in range(100):
            gw.append(transition(i))
        with StreamSource(gw.address, window=10, max_batch=4) as source:
            got = poll_until(source, 10)
            assert [t.offset for t in got] == list(range(10)) and gw.subscriptions[-1].window == 10
            source.ack(10)
            deadline = time.monotonic() + 20
            while not gw.acks and time.monotonic() < deadline:  # a wait on state: the stand-in got an ack
                time.sleep(0.01)
            # the first ack it got is ours: the source acknowledged nothing by itself, so the stand-in (which,
            # like the gateway, sends at most `window` unacknowledged) could not send more than 10 before it
            assert gw.acks == [10]
            assert [t.offset for t in got + poll_until(source, 10)] == list(range(20))


def test_stream_source_raises_a_refusal():
    with StandIn(OBS, ACT, policy="p") as gw, StreamSource(gw.address, policy="nope") as source:
        with pytest.raises(StreamError, match="NOT_FOUND"):
            poll_until(source, 1, deadline_s=10)
    with pytest.raises(ValueError, match="shard 2"):
        StreamSource("127.0.0.1:1", shard=2, num_shards=2)
