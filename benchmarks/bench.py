"""What the benchmarks' results share: the machine they were measured on, and how they are reported.

    result = {"machine": machine(cpus=os.cpu_count()), ...}
    return report(a.json, result, print_table)   # the table printed, the JSON written (atomic), the result
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from pathlib import Path

from bridge.common.files import write_json


def machine(**more) -> dict:
    """Python's version and the platform, with `more` (cpus, load)."""
    return {"python": sys.version.split()[0], "platform": platform.platform(), **more}


def report(path: Path, result: dict, table: Callable[[dict], None]) -> dict:
    """`table(result)` printed, `result` written to `path` as JSON; returns `result`."""
    table(result)
    write_json(path, result)
    print(f"wrote {path}")
    return result
