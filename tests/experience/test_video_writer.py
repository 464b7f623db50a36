"""The MP4 writer under encoder faults: SVT-AV1 now and then hands an AV1 packet over after a later one (a CI
export failed so: "Invalid argument ... returned 22", the muxer's "non monotonically increasing dts"); the writer
puts such a packet back in its place (packet n is frame n), so the file decodes in order. FFmpeg's own complaint and
the frame reach the error when a write does fail."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from bridge.experience.video import VideoWriter, read_frames

FRAMES = np.random.default_rng(0).integers(0, 255, (24, 48, 64, 3), dtype=np.uint8)


class LateHandOver:
    """The writer's real stream, but frame 6's packet handed over only after frame 7's (in the same call or a later
    one), labels untouched: as SVT-AV1 gave them under load."""

    def __init__(self, stream):
        self.stream, self.held, self.late = stream, None, 0

    def encode(self, frame):
        out = []
        for p in self.stream.encode(frame):
            if p.pts == 6:
                self.held = p
                continue
            out.append(p)
            if p.pts == 7 and self.held is not None:
                out.append(self.held)
                self.held, self.late = None, self.late + 1
        return out


def _mean_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


def test_an_av1_packet_handed_over_late_is_put_back_in_place_and_the_file_decodes_in_order(tmp_path, caplog):
    path = tmp_path / "cam.mp4"
    video = VideoWriter(path, fps=30, width=64, height=48)
    video._stream = LateHandOver(video._stream)
    with caplog.at_level(logging.WARNING), video:
        for frame in FRAMES:
            video.add(frame)
    assert video._stream.late == 1
    assert video.reordered == 1 and video.packets == video.frames == 24
    assert "gave packet 7 out of order (expected 6)" in caplog.text
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
    with pytest.raises(ValueError, match=r"gave 3 packets in order for 24 frames \(held after a gap: \[4, 5"):
        video.close()
