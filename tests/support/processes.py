"""What runs on this machine, as the tests look at it from /proc.

    assert not [line for line in command_lines() if secret in line]   # no secret on any command line
"""

from __future__ import annotations

import contextlib
from pathlib import Path

__all__ = ["command_lines"]


def command_lines() -> list[str]:
    """Every live process's command line, its arguments joined by spaces (processes gone meanwhile skipped)."""
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                lines.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return lines
