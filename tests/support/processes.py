"""What runs on this machine, as the tests look at it from /proc, and a child a test leaves behind in no case.

    assert not [line for line in command_lines() if secret in line]   # no secret on any command line
    children = descendants(demo.pid)        # {pid: command line} of every live process under the demo
    wait_until(lambda: not running(children), what="the demo's processes gone", timeout=60)
    with reaped(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)) as proc:
        out, _ = proc.communicate(timeout=10)   # a failure or timeout in the block: proc killed, its pipes drained
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

__all__ = ["command_lines", "descendants", "reaped", "running"]


def command_lines() -> list[str]:
    """Every live process's command line, its arguments joined by spaces (processes gone meanwhile skipped)."""
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                lines.append(_command_line(int(entry.name)))
    return lines


def descendants(pid: int) -> dict[int, str]:
    """Every live (non-zombie) process under `pid` (children, theirs, ...), with its command line."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None and stat[0] != "Z":
            children.setdefault(int(stat[1]), []).append(int(entry.name))
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            with contextlib.suppress(OSError):
                found[child] = _command_line(child)
                todo.append(child)
    return found


def running(processes: dict[int, str]) -> dict[int, str]:
    """Those of `processes` ({pid: command line}, as `descendants` gives) still alive: a pid that is gone, a zombie
    or now another program's (its command line changed) is not."""
    alive = {}
    for pid, line in processes.items():
        stat = _stat(pid)
        with contextlib.suppress(OSError):
            if stat is not None and stat[0] != "Z" and _command_line(pid) == line:
                alive[pid] = line
    return alive


@contextlib.contextmanager
def reaped(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """`proc`, killed and waited for (its pipes drained) should it still run when the block ends."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after "pid (comm)": state, ppid, pgrp, ...; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
