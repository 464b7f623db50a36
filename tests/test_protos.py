"""The committed generated code matches the .proto files, and the codecs round-trip."""

import filecmp

import numpy as np
import pytest

from protos import codec, tensor_pb2
from protos.generate import ROOT, generate, proto_files


def test_generated_code_is_fresh(tmp_path):
    generate(tmp_path)
    stale = []
    for proto in proto_files():
        rel = proto.relative_to(ROOT).with_suffix("")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            fresh = tmp_path / f"{rel}{suffix}"
            committed = ROOT / f"{rel}{suffix}"
            if not committed.exists() or not filecmp.cmp(fresh, committed, shallow=False):
                stale.append(str(committed.relative_to(ROOT)))
    assert not stale, f"stale generated code, run `make protos`: {stale}"


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64", "uint8", "bool"])
def test_round_trip(dtype):
    array = (np.arange(24).reshape(2, 3, 4) % 2).astype(dtype)
    back = codec.decode(codec.encode("x", array))
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_decode_rejects_wrong_byte_count():
    t = tensor_pb2.Tensor(name="qpos", dtype=tensor_pb2.FLOAT32, shape=[3], data=b"\0" * 8)
    with pytest.raises(codec.TensorError, match="qpos: 8 bytes for shape \\[3\\]"):
        codec.decode(t)


def test_unsupported_dtype_is_named():
    with pytest.raises(codec.TensorError, match="complex64"):
        codec.encode("z", np.zeros(2, np.complex64))


def test_check_all_names_the_bad_field():
    specs = (codec.Spec("a", np.float32, (2,)), codec.Spec("b", np.uint8, (1,)))
    good = [codec.encode("a", np.zeros(2, np.float32)), codec.encode("b", np.zeros(1, np.uint8))]
    assert set(codec.check_all(specs, good)) == {"a", "b"}
    cases = {
        "a: contains NaN": [codec.encode("a", np.array([0, np.nan], np.float32)), good[1]],
        "a: shape \\[3\\], expected \\[2\\]": [codec.encode("a", np.zeros(3, np.float32)), good[1]],
        "a: dtype float64, expected float32": [codec.encode("a", np.zeros(2)), good[1]],
        "b: missing": [good[0]],
        "c: not in the declared spec": [*good, codec.encode("c", np.zeros(1, np.float32))],
    }
    for message, tensors in cases.items():
        with pytest.raises(codec.TensorError, match=message):
            codec.check_all(specs, tensors)
