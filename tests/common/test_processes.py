"""bridge.common.processes with real processes: ready on a stdout line or a predicate, a group stopped whole
(SIGKILL after the grace period for a child that ignores SIGTERM), and no child outliving its parent when the
parent is SIGKILLed (the kernel's signal) or SIGTERMed inside `sigterm_interrupts` (a clean stop)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bridge.common.processes import (
    Child,
    NotReady,
    free_port,
    group_members,
    kill_with_children,
    spawn,
    stop_group,
    wait_ready,
)
from tests.support.processes import descendants, running
from tests.support.waiting import wait_until

# a leader that ignores SIGTERM, with a second process in its group
STUBBORN = ("import signal, subprocess, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "print('up', flush=True)\ntime.sleep(600)\n")


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_free_port_lies_below_the_ephemeral_range_and_skips_a_bound_port():
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])

    def after(port: int) -> int:  # the next in turn, from 10000 up to the ephemeral range and round
        return 10000 + (port + 1 - 10000) % (first_ephemeral - 10000)

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        picks = [free_port() for _ in range(50)]
        assert all(10000 <= p < first_ephemeral for p in picks), picks    # never where connect() or bind(0) lands
        assert len(set(picks)) == 50 and held.getsockname()[1] not in picks
        with socket.socket() as taken:  # a port bound by someone else is passed over
            taken.bind(("127.0.0.1", after(picks[-1])))
            assert free_port() == after(after(picks[-1]))


def test_stop_group_kills_a_child_ignoring_sigterm_after_the_grace_period_and_its_whole_group():
    proc = spawn([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        assert len(group_members(proc.pid)) == 2
        stop_group(proc, grace_s=0.5)
        assert proc.returncode == -signal.SIGKILL and not group_members(proc.pid)
        stop_group(proc)  # idempotent
    finally:
        proc.stdout.close()


# A parent whose child leads its own session, as PostgreSQL's backends do (setsid): out of the parent's group
SESSION_CHILD = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
print("up", flush=True)
time.sleep(60)
"""


def test_kill_with_children_reaches_a_child_outside_the_group():
    proc = spawn([sys.executable, "-c", SESSION_CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "up\n"
        kids = descendants(proc.pid)
        assert len(kids) == 1 and not set(kids) & set(group_members(proc.pid))  # stop_group alone would miss it
        kill_with_children(proc)
        assert proc.returncode == -signal.SIGKILL and not running(kids)
    finally:
        proc.stdout.close()


def test_a_child_is_ready_on_its_line_and_its_output_goes_to_the_log(tmp_path):
    log = tmp_path / "child.log"
    code = "import sys, time\nprint('warming up')\nprint('listening on 127.0.0.1:4321', flush=True)\n" \
           "print('oops', file=sys.stderr, flush=True)\ntime.sleep(600)\n"
    with Child([sys.executable, "-c", code], log, name="probe", ready="listening on ", timeout=60) as child:
        assert child.ready_value == "127.0.0.1:4321" and group_members(child.pid) == [child.pid]
        wait_until(lambda: "oops" in log.read_text(), what="stderr in the log")
    assert child.proc.returncode == -signal.SIGTERM
    assert {"warming up", "listening on 127.0.0.1:4321", "oops"} <= set(log.read_text().splitlines())


def test_a_child_that_exits_before_its_line_is_not_ready_with_the_end_of_its_log(tmp_path):
    child = Child([sys.executable, "-c", "import sys; sys.exit('bad flag --x')"], tmp_path / "c.log", name="probe",
                  ready="listening on ", timeout=60)
    with pytest.raises(NotReady, match=r"(?s)probe did not start within 60 s; see .*bad flag --x"):
        child.start()
    assert child.proc.returncode == 1


def test_wait_ready_tells_an_exit_from_a_timeout():
    proc = spawn([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(NotReady, match="probe exited with code 3 before it was ready") as info:
        wait_ready(proc, lambda: False, timeout=60, what="probe")
    assert info.value.exit_code == 3
    proc = spawn([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with pytest.raises(NotReady, match=r"probe not ready after 0.2 s") as info:
            wait_ready(proc, lambda: False, timeout=0.2, what="probe")
        assert info.value.exit_code is None
    finally:
        stop_group(proc)


PARENT = """
import json, os, subprocess, sys, time
from bridge.common.processes import Terminated, sigterm_interrupts, spawn, stop_group
try:
    with sigterm_interrupts():
        child = spawn([sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.DEVNULL)
        try:
            up, tell = os.pipe()
            forked = os.fork()
            if forked == 0:  # a forked copy of this process inherits the handler: SIGTERM must kill it as before
                os.write(tell, b"up")
                time.sleep(600)
                os._exit(0)
            os.read(up, 2)  # (a signal in the instant after fork is lost: CPython clears them in the new child)
            print(json.dumps([child.pid, forked]), flush=True)
            os.kill(forked, 15)
            print(os.waitpid(forked, 0)[1], flush=True)
            time.sleep(600)
        finally:
            stop_group(child)
            print("stopped", flush=True)
except Terminated:
    sys.exit(143)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_child_outlives_its_parent(sig):
    """SIGTERM inside sigterm_interrupts: the parent's `finally` stops the child before it exits (a forked copy
    still dies of SIGTERM). SIGKILL: the kernel sends the child SIGTERM (spawn's parent-death signal)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child, _ = json.loads(parent.stdout.readline())
        assert int(parent.stdout.readline()) == signal.SIGTERM  # the fork's wait status: killed by SIGTERM
        under = descendants(parent.pid)
        assert child in under and len(under) == 1
        parent.send_signal(sig)
        rest = parent.stdout.read()
        code = parent.wait(timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()
    if sig == signal.SIGTERM:
        assert rest == "stopped\n" and code == 143
        assert not running(under), "the child outlived the SIGTERMed parent"
    else:
        assert code == -signal.SIGKILL
        wait_until(lambda: not running(under), what="the SIGKILLed parent's child gone", timeout=30)


IN_A_CALLBACK = """
import asyncio, ctypes, os, sys
from bridge.common.processes import Terminated, sigterm_interrupts
def compare(a, b):  # Python called back from C (libc's qsort): an exception raised here is printed and dropped
    if not signalled:
        signalled.append(os.kill(os.getpid(), 15))
        sum(range(1000))  # bytecode: the handler runs here, inside the callback
    return a[0] - b[0]
async def main():
    values = (ctypes.c_int * 4)(3, 1, 2, 0)
    ctypes.CDLL(None).qsort(values, 4, ctypes.sizeof(ctypes.c_int),
                            ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                             ctypes.POINTER(ctypes.c_int))(compare))
    print("sorted", list(values), flush=True)
    try:
        await asyncio.wait_for(asyncio.Event().wait(), 30)  # nobody sets it: only the stop ends the wait in time
    except TimeoutError:
        print("the stop was lost", flush=True)
    finally:
        print("unwound", flush=True)
signalled = []
try:
    with sigterm_interrupts():
        asyncio.run(main())
except Terminated:
    print("terminated", flush=True)
"""


def test_a_sigterm_that_lands_in_a_callback_from_c_is_not_lost():
    """A SIGTERM whose handler runs, inside an event loop, in Python that C called (gRPC's aio callbacks in the loop's
    poll: the demo then ran on, its loop wedged) is raised by a callback of the loop's own: it unwinds the loop's
    tasks and the block."""
    run = subprocess.run([sys.executable, "-c", IN_A_CALLBACK], capture_output=True, text=True, timeout=60)
    assert run.stdout.splitlines() == ["sorted [0, 1, 2, 3]", "unwound", "terminated"], run.stdout + run.stderr
    assert "Exception ignored" not in run.stderr, run.stderr


ASKED = "import ctypes; v = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(v)); print(v.value)"  # GET


def test_the_parent_death_signal_is_asked_for_on_the_main_thread_only():
    """The kernel's signal follows the thread that forks: a worker thread's children would die when it ends."""
    def asked() -> int:
        proc = spawn([sys.executable, "-c", ASKED], stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=60)
        return int(out)

    from_worker: list[int] = []
    worker = threading.Thread(target=lambda: from_worker.append(asked()))
    worker.start()
    worker.join()
    assert asked() == signal.SIGTERM and from_worker == [0]
