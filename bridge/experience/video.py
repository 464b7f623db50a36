"""Camera frames to and from MP4 with PyAV: one constant-rate video stream, frame i at pts i / fps.

    with VideoWriter("cam.mp4", fps=30, width=64, height=48) as video:   # libsvtav1 (AV1), yuv420p
        for frame in frames:                                             # uint8 (H, W, 3) RGB
            video.add(frame)
    for seconds, frame in read_frames("cam.mp4"):                        # (pts in s, uint8 (H, W, 3))
        ...

`FrameCursor(path)` picks frames by timestamp, reading forward (as `bridge.experience.lerobot` asks for them).

The codec defaults to what LeRobot 0.4.4 writes itself (`LeRobotDataset.create`: libsvtav1, yuv420p, GOP 2, CRF 30),
which its torchcodec loader decodes (FFmpeg's libdav1d) and seeks cheaply (a key frame every other frame);
`codec="libx264"` (H.264) for players without AV1. yuv420p needs even width and height.

SVT-AV1 (libSvtAv1Enc 4.1, in PyAV's wheel), run as root, switches the thread that starts an encoder to SCHED_FIFO at
priority 99 and starts its own threads so: an export would then starve everything else on the host (a gateway's
sessions), and every process the caller starts later would inherit it (a test worker's nats-servers spun at FIFO 99
and stalled a whole CI run). The writer puts each thread it finds changed back as it was (`KeepScheduling`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import av
import av.logging
import numpy as np

__all__ = ["CODECS", "FrameCursor", "KeepScheduling", "VideoWriter", "read_frames", "video_info"]

log = logging.getLogger(__name__)
CODECS = {"libsvtav1": "av1", "libx264": "h264"}  # encoder -> the codec name readers see


_REALTIME = (os.SCHED_FIFO, os.SCHED_RR)


class KeepScheduling:
    """This process's threads' scheduling as it was when made; `restore()` puts back any thread since switched to a
    real-time policy (a thread started since: to SCHED_OTHER), so a library cannot leave us real-time.

        keep = KeepScheduling()
        encoder.encode(frame)   # may switch threads to SCHED_FIFO
        keep.restore()
    """

    def __init__(self):
        self.before = _scheduling()

    def restore(self) -> int:
        """How many threads it put back."""
        put_back = 0
        for tid, (policy, priority) in _scheduling().items():
            was = self.before.get(tid, (os.SCHED_OTHER, 0))
            if policy in _REALTIME and (policy, priority) != was:
                with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
                    os.sched_setscheduler(tid, was[0], os.sched_param(was[1]))
                    put_back += 1
        return put_back


def _scheduling() -> dict[int, tuple[int, int]]:
    """{thread id: (policy, real-time priority)} of this process's threads."""
    threads = {}
    for name in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # the thread ended meanwhile
            threads[int(name)] = (os.sched_getscheduler(int(name)), os.sched_getparam(int(name)).sched_priority)
    return threads


class VideoWriter:
    """One MP4 file; `add(frame)` appends a frame at the next 1/fps step (`frames` so far; `bytes` encoded)."""

    def __init__(self, path: str | Path, *, fps: int, width: int, height: int, codec: str = "libsvtav1",
                 crf: int = 30, gop: int = 2):
        if codec not in CODECS:
            raise ValueError(f"video codec {codec!r}: expected one of {sorted(CODECS)}")
        if width % 2 or height % 2 or width < 2 or height < 2:
            raise ValueError(f"a {width}x{height} camera: yuv420p video needs even width and height")
        if not isinstance(fps, int) or fps < 1:
            raise ValueError(f"fps {fps!r}: expected a positive integer")
        self.path, self.fps, self.width, self.height, self.codec = Path(path), fps, width, height, codec
        options = {"g": str(gop), "crf": str(crf)}
        if codec == "libsvtav1":
            options["preset"] = "12"  # LeRobot's: the fastest
            # SVT-AV1's default random-access prediction, as LeRobot writes. Its low-delay structure (pred-struct=1)
            # deadlocked once its threads were no longer real-time (every thread asleep in sem_wait under a loaded
            # CPU, tests/experience/test_export_killed.py). Its packets, out of order now and then under load, are
            # put back in order (`_in_order`)
            os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints a banner per file on stderr otherwise
        if av.logging.get_level() is None:  # FFmpeg's errors are then on stderr and in PyAV's exceptions, which would
            av.logging.set_level(av.logging.ERROR)  # otherwise say only "Invalid argument: 'cam.mp4' returned 22"
        self._container = av.open(str(self.path), "w", options={"movflags": "faststart"})
        self._stream = self._container.add_stream(codec, rate=fps, options=options)
        self._stream.width, self._stream.height, self._stream.pix_fmt = width, height, "yuv420p"
        self._time_base = Fraction(1, fps)  # frame i at pts i; the muxer keeps its own timescale (15360 at 30 fps)
        self.frames = self.packets = self.bytes = 0  # frames added, packets muxed, bytes of encoded video so far
        self.reordered = 0  # AV1 packets the encoder gave out of order (`_in_order`)
        self._held: dict[int, av.Packet] = {}  # AV1 packets waiting for one before them
        self._scheduling = KeepScheduling() if codec == "libsvtav1" and hasattr(os, "sched_getscheduler") else None

    def add(self, frame: np.ndarray) -> None:
        if frame.shape != (self.height, self.width, 3) or frame.dtype != np.uint8:
            raise ValueError(f"{self.path}: frame {self.frames} is {frame.dtype}{list(frame.shape)}, the video "
                             f"is uint8[{self.height}, {self.width}, 3]")
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
        vf.pts, vf.time_base = self.frames, self._time_base
        self._encode(vf)
        self.frames += 1

    def _encode(self, frame: av.VideoFrame | None) -> None:
        """Encodes `frame` (None: the encoder's last frames) and muxes what comes out, in order; ValueError naming the
        file, the frame and FFmpeg's own complaint when either fails."""
        if self._container is None:
            raise ValueError(f"{self.path}: the video is closed")
        try:
            packets = self._stream.encode(frame)
            if self._scheduling is not None:  # after each encode: SVT-AV1 starts its threads with the first frame
                self._scheduling.restore()
            if self.codec == "libsvtav1":
                packets = self._in_order(packets)
            self.packets += len(packets)
            self.bytes += sum(p.size for p in packets)
            self._container.mux(packets)
        except av.FFmpegError as exc:  # (a ValueError too: caught first)
            self._abandon()
            at = "flushing the encoder" if frame is None else f"frame {self.frames}"
            raise ValueError(f"{self.path}: {self.codec} video, {at}: {exc}") from None
        except ValueError:  # the encoder's packets do not make a stream (`_in_order`)
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Closes the file after a failed write; a later close() has nothing to do."""
        container, self._container = self._container, None
        with contextlib.suppress(av.FFmpegError):
            container.close()

    def _in_order(self, packets: list[av.Packet]) -> list[av.Packet]:
        """The AV1 packets that are next in the stream. A packet is a temporal unit, and temporal units go in
        presentation order with one shown frame each (AV1 spec 7.5): packet n is frame n, which SVT-AV1 labels pts =
        dts = n. Now and then under load it hands one over after a later one ("non monotonically increasing dts" at
        the muxer); such a packet is held until those before it have come (counted: `reordered`, the first logged)."""
        ready: list[av.Packet] = []
        for packet in packets:
            n = self.packets + len(ready)  # the packet the stream needs next
            if packet.pts is None or packet.pts < n or packet.pts in self._held:
                raise ValueError(f"{self.path}: the encoder gave a packet labelled {packet.pts} after {n} packets "
                                 f"(held: {sorted(self._held)})")
            if packet.pts != n:
                self.reordered += 1
                if self.reordered == 1:
                    log.warning("%s: the encoder gave packet %d out of order (expected %d); put back in place",
                                self.path, packet.pts, n)
            self._held[packet.pts] = packet
            while n in self._held:
                ready.append(self._held.pop(n))
                n += 1
        for packet in ready:
            packet.dts = packet.pts
        return ready

    def close(self) -> None:
        if self._container is None:
            return
        self._encode(None)
        container, self._container = self._container, None
        try:
            container.close()  # writes the index (moov) and moves it to the front
        except av.FFmpegError as exc:
            raise ValueError(f"{self.path}: {self.codec} video, writing its index: {exc}") from None
        if self.packets != self.frames:
            raise ValueError(f"{self.path}: the {self.codec} encoder gave {self.packets} packets in order for "
                             f"{self.frames} frames (held after a gap: {sorted(self._held)})")

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def info(self) -> dict:
        """The `info` block LeRobot keeps per video feature (lerobot.datasets.video_utils.get_video_info)."""
        return {"video.height": self.height, "video.width": self.width, "video.codec": CODECS[self.codec],
                "video.pix_fmt": "yuv420p", "video.is_depth_map": False, "video.fps": self.fps,
                "video.channels": 3, "has_audio": False}


def read_frames(path: str | Path) -> Iterator[tuple[float, np.ndarray]]:
    """(pts in seconds, uint8 (H, W, 3) RGB) of every frame of the first video stream, in presentation order;
    ValueError naming the file when it does not open or decode."""
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ValueError(f"{path}: no video stream")
            stream = container.streams.video[0]
            for frame in container.decode(stream):
                yield float(frame.pts * stream.time_base), frame.to_ndarray(format="rgb24")
    except av.error.FFmpegError as exc:
        raise ValueError(f"{path}: does not decode ({exc})") from None


def video_info(path: str | Path) -> dict:
    """Width, height, codec, pix_fmt, frames per second, frames (when the container says) of the first video."""
    with av.open(str(path)) as container:
        if not container.streams.video:
            raise ValueError(f"{path}: no video stream")
        s = container.streams.video[0]
        return {"width": s.codec_context.width, "height": s.codec_context.height, "codec": s.codec_context.name,
                "pix_fmt": s.codec_context.pix_fmt, "fps": float(s.average_rate or 0), "frames": s.frames}


class FrameCursor:
    """The frames of one video picked by timestamp: `at(t)` gives the frame whose pts is within `tolerance_s` of
    `t` (ValueError naming the file otherwise). Reads forward; a request behind the last one reopens the file."""

    def __init__(self, path: str | Path, *, tolerance_s: float = 1e-4):
        self.path, self.tolerance_s = Path(path), tolerance_s
        self._frames: Iterator[tuple[float, np.ndarray]] | None = None
        self._prev: tuple[float, np.ndarray] | None = None
        self._next: tuple[float, np.ndarray] | None = None

    def at(self, t: float) -> np.ndarray:
        if self._frames is None or (self._prev is not None and t < self._prev[0] - self.tolerance_s):
            self._frames, self._prev, self._next = read_frames(self.path), None, None
            self._next = next(self._frames, None)
        while self._next is not None and self._next[0] <= t + self.tolerance_s:
            self._prev, self._next = self._next, next(self._frames, None)
        best = self._prev
        if best is None or abs(best[0] - t) > self.tolerance_s:
            near = "none" if best is None else f"{best[0]:.6f} s"
            raise ValueError(f"{self.path}: no frame at {t:.6f} s (nearest before: {near}; tolerance "
                             f"{self.tolerance_s} s): the video is shorter than its episodes or not at their rate")
        return best[1]

    def close(self) -> None:
        if self._frames is not None:
            self._frames.close()
            self._frames = None
