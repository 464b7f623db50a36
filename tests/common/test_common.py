"""bridge.common: one percentile definition, one KEY=VALUE parser, one atomic write."""

from __future__ import annotations

import os
import stat

import pytest

from bridge.common.errors import NotFound, TetherError
from bridge.common.files import write_atomic, write_json
from bridge.common.kv import parse_pairs
from bridge.common.percentiles import p50_p99, percentile, percentiles, summary_ms


def test_percentile_is_nearest_rank_and_always_a_sample():
    samples = [5, 1, 4, 2, 3]
    assert percentiles(samples, (1, 20, 21, 50, 99, 100)) == [1, 1, 2, 3, 5, 5]
    # numpy's linear interpolation would answer 4.96 here: not a latency that happened
    assert percentile(samples, 99) in samples
    assert p50_p99([]) == (0.0, 0.0)
    assert summary_ms([2_000_000] * 3) == {"p50": 2.0, "p99": 2.0}


@pytest.mark.parametrize("q", [0, -1, 100.5])
def test_percentile_refuses_a_rank_outside_0_100(q):
    with pytest.raises(ValueError, match="percentile must be in"):
        percentile([1, 2], q)


def test_percentile_of_no_samples_is_an_error():
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)


def test_pairs_repeated_and_comma_joined_agree():
    assert parse_pairs(["robot=arm_2", "site=lab"]) == parse_pairs("robot=arm_2,site=lab") == {
        "robot": "arm_2", "site": "lab"}
    assert parse_pairs(["expr=a=b"]) == {"expr": "a=b"}          # only the first '=' splits
    assert parse_pairs(None) == parse_pairs([]) == parse_pairs("") == {}


@pytest.mark.parametrize("bad", ["robot", "=arm", "robot=", "a=1,b"])
def test_pairs_name_the_bad_item(bad):
    with pytest.raises(ValueError, match=r"--labels '.*' must be KEY=VALUE"):
        parse_pairs(bad, what="--labels")


def test_atomic_write_replaces_whole_file_with_mode(tmp_path):
    path = tmp_path / "deep" / "state.json"
    write_json(path, {"v": 1})
    write_atomic(path, b"new\n")
    assert path.read_bytes() == b"new\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(path.parent) == ["state.json"]


def test_failed_atomic_write_keeps_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "state.json"
    write_json(path, {"v": 1})
    with pytest.raises(TypeError):
        write_json(path, {"v": object()})                         # not JSON: fails before anything is written
    with pytest.raises(TypeError):
        write_atomic(path, "text, not bytes")                     # fails inside the temp file's write
    assert path.read_text() == '{\n  "v": 1\n}\n'
    assert os.listdir(tmp_path) == ["state.json"]


def test_errors_carry_their_status():
    assert issubclass(NotFound, TetherError)
    assert NotFound.status.name == "NOT_FOUND" and TetherError.status.name == "INTERNAL"
