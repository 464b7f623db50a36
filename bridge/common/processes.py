"""Child processes that die with their parent.

    subprocess.Popen(cmd, start_new_session=True, preexec_fn=parent_death_signal())
    subprocess.Popen(cmd, preexec_fn=parent_death_signal(signal.SIGKILL, main_thread_only=True))

The kernel sends the child `sig` when the *thread* that forked it ends (PR_SET_PDEATHSIG), so a
killed test, tool or launcher leaves no server behind.
"""

from __future__ import annotations

import ctypes
import signal
import threading
from collections.abc import Callable

__all__ = ["parent_death_signal"]

_PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: int = signal.SIGTERM, *, main_thread_only: bool = False) -> Callable[[], None] | None:
    """A `preexec_fn` asking for `sig` on the parent's death. With `main_thread_only`, None off the main
    thread (a worker thread ends long before the process: its children would die with it). libc's prctl
    is found here, in the parent: the child only calls it."""
    if main_thread_only and threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:  # in the child, between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(sig))

    return preexec
