"""Encoded camera tensors: protos.codec's JPEG/PNG decoding and its checks, the gateway's decode pool
(bridge.gateway.session.images), the edge's camera entries in the topic map (bridge.ros2.cameras)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from bridge.gateway.session.images import ImageDecoder, encoded
from bridge.ros2 import messages
from bridge.ros2.topic_map import TopicMapError, parse_topic_map
from protos import experience_pb2
from protos.codec import (
    JPEG,
    PNG,
    RAW,
    Spec,
    TensorError,
    check_all,
    decode,
    encode,
    encode_image,
    transition_problem,
)


def frame(shape=(24, 32, 3), seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:shape[0], 0:shape[1]]
    smooth = np.stack([x * 6, y * 8, x + y][: shape[2]], axis=-1) + rng.integers(0, 8, shape)
    return np.clip(smooth, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("fmt", ["jpeg", "png"])
@pytest.mark.parametrize("channels", [3, 1])
def test_images_decode_to_their_declared_uint8_shape(fmt, channels):
    image = frame((24, 32, channels))
    t = encode_image("cam", image, format=fmt, quality=95)
    assert t.encoding == {"jpeg": JPEG, "png": PNG}[fmt] and list(t.shape) == [24, 32, channels]
    assert len(t.data) < image.nbytes or fmt == "png"
    back = decode(t)
    assert back.dtype == np.uint8 and back.shape == image.shape
    if fmt == "png":
        np.testing.assert_array_equal(back, image)                   # lossless
    else:
        assert np.abs(back.astype(int) - image).mean() < 3           # quality 95


def test_bad_images_raise_tensor_errors_naming_the_tensor():
    t = encode_image("wrist", frame())
    cut = experience_pb2.Transition().observation.add()
    cut.CopyFrom(t)
    cut.data = t.data[:-40]
    with pytest.raises(TensorError, match=r"^wrist: corrupt JPEG \(\d+ bytes\): Premature end") as exc:
        decode(cut)
    assert exc.value.field == "wrist"
    other = type(t)()
    other.CopyFrom(t)
    other.shape[:] = [24, 30, 3]
    with pytest.raises(TensorError, match=r"wrist: JPEG image is \[24, 32, 3\], declared \[24, 30, 3\]"):
        decode(other)
    other.shape[:] = [24, 32, 1]                                         # a colour JPEG declared mono
    with pytest.raises(TensorError, match=r"JPEG image is \[24, 32, 3\], declared \[24, 32, 1\]"):
        decode(other)
    png = encode_image("front", frame(), format="png")
    png.data = b"GIF89a" + png.data[6:]
    with pytest.raises(TensorError, match="front: corrupt PNG"):
        decode(png)
    with pytest.raises(TensorError, match=r"cam: an encoded image decodes to uint8 \(H, W, 3\) or \(H, W, 1\), "
                                          r"not float32\[4, 4, 1\]"):
        encode_image("cam", np.zeros((4, 4), np.float32))
    with pytest.raises(TensorError, match="image format 'gif'"):
        encode_image("cam", frame(), format="gif")


def test_specs_carry_the_encoding_and_check_what_arrives():
    spec = Spec("cam", np.uint8, (24, 32, 3), encoding=JPEG)
    assert Spec.from_proto(spec.to_proto()) == spec and spec.to_proto().encoding == JPEG
    assert spec != Spec("cam", np.uint8, (24, 32, 3))                     # another wire contract
    with pytest.raises(TensorError, match=r"cam: JPEG: an encoded image decodes to uint8 .* not uint8\[24, 32\]"):
        Spec("cam", np.uint8, (24, 32), encoding=JPEG)
    with pytest.raises(TensorError, match="unknown encoding 9"):
        Spec("cam", np.uint8, (24, 32, 3), encoding=9)
    t = encode_image("cam", frame())
    assert check_all([spec], [t])["cam"].shape == (24, 32, 3)
    with pytest.raises(TensorError, match="cam: encoding JPEG, declared RAW"):
        check_all([Spec("cam", np.uint8, (24, 32, 3))], [t])
    with pytest.raises(TensorError, match="cam: encoding RAW, declared JPEG"):
        check_all([spec], [encode("cam", frame())])
    huge = type(t)()
    huge.CopyFrom(t)
    huge.data = t.data + bytes(24 * 32 * 3 + 70_000)
    with pytest.raises(TensorError, match=r"cam: \d+ bytes of JPEG for a \[24, 32, 3\] image"):
        spec.check_declared(huge)                                         # refused before any decoding


def test_transition_problem_decodes_images():
    t = experience_pb2.Transition(observation=[encode_image("cam", frame())],
                                  action=[encode("action", np.zeros(2, np.float32))])
    assert transition_problem(t) is None
    t.observation[0].data = t.observation[0].data[:100]
    assert transition_problem(t).startswith("observation.cam: corrupt JPEG")


def test_the_pool_decodes_a_steps_frames_off_the_event_loop_and_names_a_bad_one():
    specs = encoded([Spec("a", np.uint8, (24, 32, 3), encoding=JPEG), Spec("b", np.uint8, (24, 32, 1),
                     encoding=PNG), Spec("q", np.float32, (3,))])
    assert sorted(specs) == ["a", "b"] and all(s.encoding != RAW for s in specs.values())
    a, b = encode_image("a", frame()), encode_image("b", frame((24, 32, 1)), format="png")
    images = ImageDecoder(threads=2)
    threads: set[str] = set()
    real = images._pool.submit

    def spy(fn, *args):
        return real(lambda: (threads.add(threading.current_thread().name), fn(*args))[1])
    images._pool.submit = spy
    try:
        arrays = asyncio.run(images.decode(specs, [a, b, encode("q", np.zeros(3, np.float32))]))
        assert sorted(arrays) == ["a", "b"] and threads and all(n.startswith("tether-images") for n in threads)
        np.testing.assert_array_equal(arrays["a"], decode(a))
        np.testing.assert_array_equal(arrays["b"], frame((24, 32, 1)))
        a.data = a.data[:-40]
        with pytest.raises(TensorError, match="a: corrupt JPEG"):
            asyncio.run(images.decode(specs, [a, b]))
        assert (images.decoded, images.failed) == (3, 1)
    finally:
        images.close()
    with pytest.raises(ValueError, match="decode threads must be >= 1, got 0"):
        ImageDecoder(threads=0)


ACTION = [{"topic": "/cmd", "type": "std_msgs/msg/Float64MultiArray", "joints": ["j"],
           "tensors": {"action": {"field": "data", "bounds": [-1.0, 1.0]}}}]
JOINTS = {"topic": "/joint_states", "type": "sensor_msgs/msg/JointState", "joints": ["j"],
          "tensors": {"q": {"field": "position"}}}


def camera_map(**tensor) -> object:
    kind = "sensor_msgs/msg/CompressedImage" if "format" in tensor else "sensor_msgs/msg/Image"
    return parse_topic_map({"observation": [JOINTS, {"topic": "/cam", "type": kind, "tensors": {
        "cam": {"field": "image", "shape": [24, 32, 3], **tensor}}}], "action": ACTION})


def test_the_topic_map_forwards_compressed_frames_and_encodes_raw_ones():
    image = frame((48, 64, 3))
    jpeg = encode_image("x", image).data
    tmap = camera_map(format="jpeg")
    latest = {"/joint_states": messages.joint_state(names=["j"], position=[0.5]),
              "/cam": messages.compressed_image(jpeg, format="jpeg")}
    obs = tmap.observation_arrays(latest)
    assert obs["cam"].data == jpeg and obs["cam"].encoding == JPEG and list(obs["cam"].shape) == [24, 32, 3]
    latest["/cam"] = messages.compressed_image(jpeg, format="png")
    with pytest.raises(messages.MessageError, match=r"/cam: CompressedImage holds png \('png'\), the topic map "
                                                    "says jpeg"):
        tmap.observation_arrays(latest)
    tmap = camera_map(encode={"format": "png", "resize": [24, 32]})
    assert tmap.observation_specs()[1] == Spec("cam", np.uint8, (24, 32, 3), encoding=PNG)
    latest["/cam"] = messages.image(image)
    cam = tmap.observation_arrays(latest)["cam"]
    assert cam.encoding == PNG and decode(cam).shape == (24, 32, 3)
    assert abs(float(decode(cam).mean()) - float(image.mean())) < 2      # the same scene, scaled down
    no_resize = camera_map(encode={"format": "jpeg", "quality": 80})
    with pytest.raises(messages.MessageError, match=r"/cam: Image is \[48, 64, 3\], tensor 'cam' takes "
                                                    r"\[24, 32, 3\] \(set encode.resize to scale it\)"):
        no_resize.observation_arrays(latest)
    latest["/cam"] = messages.image(frame((48, 64, 1)))
    with pytest.raises(messages.MessageError, match=r"'mono8' has 1 channel\(s\), tensor 'cam' takes 3"):
        tmap.observation_arrays(latest)


@pytest.mark.parametrize("tensor, message", [
    ({"format": "gif"}, r"observation\[1\].tensors.cam.format: 'gif' is not one of \['jpeg', 'png'\]"),
    ({"encode": {"quality": 101}}, r"tensors.cam.encode.quality: expected an integer 1..100, got 101"),
    ({"encode": {"resize": [12, 16]}}, r"encode.resize: \[12, 16\] disagrees with the tensor's shape \[24, 32, 3\]"),
    ({"encode": {"format": "jpeg", "size": 3}}, r"tensors.cam.encode.size: unknown key"),
    ({"encode": {}, "dtype": "float32"}, r"tensors.cam.dtype: float32: an encoded camera tensor is uint8"),
])
def test_camera_entries_name_their_mistakes(tensor, message):
    with pytest.raises(TopicMapError, match=message):
        camera_map(**tensor)
