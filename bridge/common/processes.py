"""Child processes, one way: each leads its own process group, is ready when it says so, is stopped with its
group, and never outlives this process, however this process ends.

    port = free_port()                                        # a free TCP port on loopback
    proc = spawn([binary, "-c", conf], stdout=log)            # its own group; the kernel's SIGTERM should we die
    wait_ready(proc, lambda: healthy(port), what="nats-server", timeout=30)   # NotReady: it exited, or too slow
    with Child(cmd, log_path, name="gateway", ready="gateway listening on ") as gw:
        gw.ready_value                                        # the rest of that stdout line: "127.0.0.1:PORT"
    stop_group(proc, grace_s=10)                              # SIGTERM; SIGKILL to its group after 10 s; until gone
    kill_with_children(proc)                                  # a crash: SIGKILL, children in sessions of their own too
    with sigterm_interrupts():                                # SIGTERM raises Terminated (a KeyboardInterrupt) here,
        run_demo(config)                                      # so every `with`/`finally` on the way stops its child

The promise: a clean end, an exception, Ctrl-C and (under `sigterm_interrupts`) SIGTERM unwind the `with` blocks,
`finally` clauses and finalizers (also run at interpreter exit) that stop each child with its group. SIGKILL cannot
be caught: for it the kernel sends each child `death_signal` when the thread that started it ends
(PR_SET_PDEATHSIG). `spawn` asks for it on the main thread only, which ends with the process; a worker thread ends
long before, and its children would die with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from bridge.common.lifecycle import Started

__all__ = ["Child", "NotReady", "Terminated", "children", "free_port", "group_members", "kill_with_children",
           "sigterm_interrupts", "spawn", "stop_group", "wait_ready"]

_SWEEP_S = 5.0  # after the leader: how long stop_group SIGKILLs what is left of its group


class NotReady(RuntimeError):
    """A child exited before it was ready (`exit_code`, its status), or was not ready in time (`exit_code` None)."""

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.exit_code = exit_code


class Terminated(KeyboardInterrupt):
    """SIGTERM inside `sigterm_interrupts()`: unwinds like Ctrl-C, each `with` block stopping its children."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (bind it soon: another process may take it).

    Picked below the kernel's ephemeral range, where no connect() and no bind to port 0 ever lands, in turn from a
    random start in each process: so that neither the kernel's own picks nor another process's `free_port` are
    likely to take it between now and the bind. The kernel's pick where nothing lies below that range."""
    low, high = _PICKABLE
    with _picking:
        for _ in range(high - low):
            port = low + next(_turn) % (high - low)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError as exc:
                    if exc.errno == errno.EADDRINUSE:
                        continue
                    raise
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _pickable() -> tuple[int, int]:
    """[10000, the first ephemeral port) when that holds at least 2,000 ports, else an empty range."""
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first = 32768  # the kernel's default
    return (10000, first) if first - 10000 >= 2000 else (0, 0)


_PICKABLE = _pickable()


def _new_turn() -> None:
    global _turn, _picking
    _turn = itertools.count(random.SystemRandom().randrange(1 << 30))
    _picking = threading.Lock()


_new_turn()
os.register_at_fork(after_in_child=_new_turn)  # a forked child (multiprocessing) must not repeat our picks


def spawn(cmd: Sequence[str], *, death_signal: int = signal.SIGTERM, **popen) -> subprocess.Popen:
    """`subprocess.Popen(cmd, **popen)` leading a new session (its own process group, out of reach of the terminal's
    Ctrl-C), which the kernel sends `death_signal` should the (main) thread starting it end first."""
    cmd = list(cmd)
    if threading.current_thread() is threading.main_thread():
        _must_exist(cmd[0], popen.get("env"), popen.get("cwd"))
        name = signal.Signals(death_signal).name.removeprefix("SIG")
        cmd = ["setpriv", f"--pdeathsig={name}", "--", "sh", "-c", _UNLESS_ORPHANED.format(name), str(os.getpid()),
               *cmd]
    return subprocess.Popen(cmd, start_new_session=True, **popen)


# The death signal is asked for by util-linux's setpriv, not by a preexec_fn: a preexec_fn makes Python fork()
# instead of vfork(), which runs gRPC's fork handlers in the child, and those abort it (SIGABRT, "epoll_wait
# error") while another thread is in a gRPC call. Then sh, whose $0 is our pid, execs the command unless we
# died before setpriv's prctl (no signal would come).
_UNLESS_ORPHANED = '[ "$PPID" = "$0" ] || kill -s {} $$; exec "$@"'


def _must_exist(program: str, env: Mapping[str, str] | None, cwd: Path | str | None) -> None:
    """FileNotFoundError, as Popen would raise, for a program that is not there (sh would only exit 127)."""
    if os.sep in program:
        found = os.access(Path(cwd or ".") / program, os.X_OK)
    else:
        found = shutil.which(program, path=(os.environ if env is None else env).get("PATH", os.defpath)) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", program)


def wait_ready(proc: subprocess.Popen, ready: Callable[[], object], *, timeout: float, what: str,
               period: float = 0.05) -> None:
    """Poll `ready()` until it is true; NotReady when `proc` exits first or `timeout` s pass."""
    deadline = time.monotonic() + timeout
    while not ready():
        code = proc.poll()
        if code is not None:
            raise NotReady(f"{what} exited with code {code} before it was ready", exit_code=code)
        if time.monotonic() > deadline:
            raise NotReady(f"{what} not ready after {timeout:g} s")
        time.sleep(period)


def stop_group(proc: subprocess.Popen, *, grace_s: float = 10.0, sig: int = signal.SIGTERM) -> None:
    """Stop `proc` and its process group: `sig` to `proc` (it stops what it started, in its own order: Triton its
    backend stubs, torchrun its ranks, the postmaster its backends), SIGKILL when it has not exited after
    `grace_s`, then SIGKILL to whatever of its group is left until nothing is. Idempotent; returns once it is reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + _SWEEP_S
    while group_members(proc.pid) and time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.02)


def kill_with_children(proc: subprocess.Popen) -> None:
    """SIGKILL `proc`, its process group and its children at once, as a crash of the host would; returns once
    none of them runs. For a server whose workers lead their own sessions (PostgreSQL's backends call setsid):
    `proc` is stopped first so that it starts no more, and killed with the children it had then."""
    if proc.poll() is not None:  # reaped: its pid may be another process's now
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGSTOP)
    kids = children(proc.pid)
    for pid in kids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stop_group(proc, grace_s=0, sig=signal.SIGKILL)
    deadline = time.monotonic() + _SWEEP_S
    while set(kids) & set(_live(lambda ppid, pgrp: True)) and time.monotonic() < deadline:
        time.sleep(0.01)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`, read from /proc."""
    return _live(lambda ppid, pgrp: pgrp == pgid)


def children(pid: int) -> list[int]:
    """Live (non-zombie) processes whose parent is `pid`, read from /proc."""
    return _live(lambda ppid, pgrp: ppid == pid)


def _live(match: Callable[[int, int], bool]) -> list[int]:
    """Live (non-zombie) processes for which `match(ppid, pgrp)`, read from /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if fields[0] != "Z" and match(int(fields[1]), int(fields[2])):
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside the block SIGTERM (what `timeout`, systemd, Kubernetes and a cancelled CI job send) raises Terminated
    in the main thread, once: a second SIGTERM does not cut the stop short (nor does a forked child, which dies of
    it as before). Only where SIGTERM still has its default action, on the main thread; the default is back after
    the block."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    fired, owner = [], os.getpid()

    def interrupt(signum, frame):
        if os.getpid() != owner:  # a forked child inherited the handler: it dies as it would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        elif not fired:
            fired.append(signum)
            loop = asyncio._get_running_loop()
            if loop is None:
                raise Terminated(f"signal {signum} (SIGTERM)")
            # inside an event loop the handler may be running in Python that C called back (grpc's aio callbacks
            # in the loop's poll), where an exception is printed and dropped ("Exception ignored in ...
            # functor_run"): the stop was lost and the loop wedged. A callback of the loop's own raises it instead
            # (the loop lets a KeyboardInterrupt out), unwinding asyncio.run and every `with` block around it
            loop.call_soon_threadsafe(_raise_terminated, signum)

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGTERM) is interrupt:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _raise_terminated(signum: int) -> None:
    raise Terminated(f"signal {signum} (SIGTERM)")


class Child(Started):
    """`cmd` started by `spawn`, its stdout and stderr appended to `log_path`, stopped by `stop_group`. With `ready`,
    `start()` returns once a stdout line starts with it, giving the rest of that line (`ready_value`), and raises
    NotReady naming `name`, with the log's end, when none came within `timeout` s. `stop()` is idempotent, also run
    by a finalizer when the Child is dropped or at interpreter exit. `env`: the whole environment (None: ours).

        with Child([sys.executable, "-m", "trainer.rendezvous"], log, name="rendezvous", ready=READY) as rdzv:
            rdzv.ready_value    # "127.0.0.1:29400"
    """

    def __init__(self, cmd: Sequence[str], log_path: Path | str, *, name: str, ready: str = "", timeout: float = 60.0,
                 grace_s: float = 10.0, env: Mapping[str, str] | None = None, cwd: Path | str | None = None):
        if isinstance(cmd, str):
            raise TypeError(f"cmd must be a sequence of arguments, got the string {cmd!r}")
        self.cmd, self.log_path, self.name, self.ready = list(cmd), Path(log_path), name, ready
        self.timeout, self.grace_s, self.env, self.cwd = timeout, grace_s, env, cwd
        self.proc: subprocess.Popen | None = None
        self.ready_value: str | None = None
        self._finalizer: weakref.finalize | None = None

    pid = property(lambda self: self.proc.pid if self.proc is not None else None)

    def start(self) -> str:
        """Start it; with `ready`, wait for its line and return the rest of it ("" without)."""
        if self.proc is not None:
            raise RuntimeError(f"{self.name} already started (pid {self.proc.pid})")
        log = open(self.log_path, "a")  # noqa: SIM115 - closed by _stop_child, after the process
        try:
            self.proc = spawn(self.cmd, stdout=subprocess.PIPE if self.ready else log, stderr=log, text=True,
                              env=self.env, cwd=self.cwd)
        except BaseException:
            log.close()
            raise
        found: list[str] = []
        seen = threading.Event()
        pumping = None
        if self.ready:
            pumping = threading.Thread(target=_pump, args=(self.proc.stdout, log, self.ready, found, seen),
                                       daemon=True, name=f"{self.name}-log")
            pumping.start()
        self._finalizer = weakref.finalize(self, _stop_child, self.proc, pumping, log, self.grace_s)
        if self.ready:
            seen.wait(self.timeout)
            if not found:
                self.stop()
                raise NotReady(f"{self.name} did not start within {self.timeout:g} s; see {self.log_path}:\n"
                               + self.log_path.read_text(errors="replace")[-2000:])
            self.ready_value = found[0]
        return self.ready_value or ""

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # runs _stop_child once
            self._finalizer = None


def _pump(stdout, log, ready: str, found: list[str], seen: threading.Event) -> None:
    """Every stdout line to the log; the first starting with `ready` tells the rest of it."""
    for line in stdout:
        if not found and line.startswith(ready):
            found.append(line[len(ready):].strip())
            seen.set()
        log.write(line)
        log.flush()
    seen.set()


def _stop_child(proc: subprocess.Popen, pumping: threading.Thread | None, log, grace_s: float) -> None:
    stop_group(proc, grace_s=grace_s)
    if pumping is not None:
        pumping.join(5)
    log.close()
