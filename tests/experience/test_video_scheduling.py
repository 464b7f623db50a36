"""An AV1 export never leaves its process real-time: SVT-AV1 4.1, as root, switches the thread that starts an
encoder and the threads it starts to SCHED_FIFO 99 (which children then inherit: nats-servers spinning at FIFO 99
stalled a CI run); bridge.experience.video puts back what it changed, and only that."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from bridge.experience.video import KeepScheduling, VideoWriter, read_frames

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setscheduler") or os.geteuid() != 0,
                                reason="real-time scheduling: SVT-AV1 switches to it only as root, and only root "
                                       "may set it here")


def _policies() -> dict[int, int]:
    return {int(tid): os.sched_getscheduler(int(tid)) for tid in os.listdir("/proc/self/task")}


def test_an_av1_export_leaves_every_thread_as_it_was(tmp_path):
    before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    frames = np.random.default_rng(0).integers(0, 255, (12, 48, 64, 3), dtype=np.uint8)
    with VideoWriter(tmp_path / "cam.mp4", fps=30, width=64, height=48) as video:
        for frame in frames:
            video.add(frame)
            assert os.SCHED_FIFO not in _policies().values(), "a thread left at SCHED_FIFO while encoding"
    assert (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) == before
    assert len(list(read_frames(tmp_path / "cam.mp4"))) == 12


def test_keep_scheduling_puts_back_what_changed_and_leaves_a_real_time_thread_it_found():
    ready, changed, done = threading.Event(), threading.Event(), threading.Event()
    tids = {}

    def worker(name: str, priority: int | None):
        tids[name] = threading.get_native_id()
        if priority is not None:  # real-time before the snapshot: the caller's own, kept
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
        ready.wait()
        if name == "switched":
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(99))  # as SVT-AV1 does
            changed.set()
        done.wait()

    threads = [threading.Thread(target=worker, args=("switched", None)),
               threading.Thread(target=worker, args=("own", 10))]
    for t in threads:
        t.start()
    try:
        while len(tids) < 2 or os.sched_getscheduler(tids["own"]) != os.SCHED_FIFO:
            threading.Event().wait(0.01)
        keep = KeepScheduling()
        ready.set()
        assert changed.wait(10)
        assert os.sched_getscheduler(tids["switched"]) == os.SCHED_FIFO
        assert keep.restore() == 1
        assert os.sched_getscheduler(tids["switched"]) == os.SCHED_OTHER
        assert os.sched_getscheduler(tids["own"]) == os.SCHED_FIFO
        assert os.sched_getparam(tids["own"]).sched_priority == 10
    finally:
        done.set()
        for t in threads:
            t.join()
