"""The MP4 writer under encoder faults: AV1 packets are stamped by their place in the stream (a temporal unit per
shown frame, in presentation order), so an encoder that labels a packet out of order no longer fails the muxer
("non monotonically increasing dts": a CI export failed so, "Invalid argument ... returned 22"); FFmpeg's own
complaint and the frame reach the error when a write does fail."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from bridge.experience.video import VideoWriter, read_frames

FRAMES = np.random.default_rng(0).integers(0, 255, (24, 48, 64, 3), dtype=np.uint8)


class MislabellingEncoder:
    """The writer's real stream, but frame 6's packet labelled 4 (behind frame 5's), as an encoder that copies a
    label from the wrong input buffer would give it."""

    def __init__(self, stream):
        self.stream, self.mislabelled = stream, 0

    def encode(self, frame):
        packets = self.stream.encode(frame)
        for p in packets:
            if p.pts == 6:
                p.pts = p.dts = 4
                self.mislabelled += 1
        return packets


def _mean_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def test_av1_packets_labelled_out_of_order_are_stamped_by_their_place_and_decode_in_order(tmp_path, caplog):
    path = tmp_path / "cam.mp4"
    video = VideoWriter(path, fps=30, width=64, height=48)
    video._stream = MislabellingEncoder(video._stream)
    with caplog.at_level(logging.WARNING), video:
        for frame in FRAMES:
            video.add(frame)
    assert video._stream.mislabelled == 1
    assert video.relabelled == 1 and video.packets == video.frames == 24
    assert "labelled packet 6 with pts 4" in caplog.text
    back = list(read_frames(path))
    assert [round(t * 30) for t, _ in back] == list(range(24))
    # each decoded frame is nearest its own original (random frames: another one is ~85 grey levels away)
    for i, (_, frame) in enumerate(back):
        errors = [_mean_error(frame, original) for original in FRAMES]
        assert int(np.argmin(errors)) == i, f"frame {i} decodes as frame {int(np.argmin(errors))}"


def test_a_failed_mux_names_the_file_the_frame_and_ffmpegs_reason(tmp_path):
    video = VideoWriter(tmp_path / "cam.mp4", fps=30, width=64, height=48, codec="libx264")
    real = video._stream

    class BackwardsTimes:  # H.264 keeps the encoder's times (B-frames): a packet that goes back fails the muxer
        left = 100

        def encode(self, frame):
            packets = real.encode(frame)
            for p in packets:
                self.left -= 1
                p.dts = p.pts = self.left
            return packets

    video._stream = BackwardsTimes()
    with pytest.raises(ValueError) as failed:
        for frame in FRAMES:
            video.add(frame)
        video.close()
    message = str(failed.value)
    assert str(tmp_path / "cam.mp4") in message and "libx264 video" in message
    assert "non monotonically increasing dts" in message, message   # FFmpeg's log line, not only "returned 22"
    video.close()  # closing again after the failure is harmless


def test_an_encoder_that_loses_a_frame_fails_the_file(tmp_path):
    video = VideoWriter(tmp_path / "cam.mp4", fps=30, width=64, height=48)
    real = video._stream

    class Dropping:
        def encode(self, frame):
            packets = real.encode(frame)
            return [p for p in packets if p.pts != 3]

    video._stream = Dropping()
    for frame in FRAMES:
        video.add(frame)
    with pytest.raises(ValueError, match="gave 23 packets for 24 frames"):
        video.close()
