"""What the benchmarks' results share: the machine they were measured on, and how they are reported.

    p = parser(__file__, __doc__, rounds=(5, "alternating blocks"), per_round=(300, "round trips per block"))
    result = {"machine": machine(cpus=os.cpu_count()), ...}
    return report(a.json, result, print_table)   # the table printed, the JSON written (atomic), the result
    obs, act = specs("Hopper-v5")                # an env's specs (sim.make), the env closed
    say("round 1 done")                          # [NAME HH:MM:SS] round 1 done, NAME the benchmark's
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bridge.common.files import write_json


def parser(script: str, doc: str, *, rounds: tuple[int, str] | None = None,
           per_round: tuple[int, str] | None = None) -> argparse.ArgumentParser:
    """The parser of benchmarks/NAME.py (`script`: its `__file__`, `doc`: its docstring): `--json` (default
    benchmarks/results/NAME.json) and, each given as (default, help), `--rounds` and `--per-round`."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--json", type=Path, default=Path(script).parent / "results" / f"{Path(script).stem}.json",
                   help="where the results go (default: %(default)s)")
    for flag, given in (("--rounds", rounds), ("--per-round", per_round)):
        if given is not None:
            p.add_argument(flag, type=int, default=given[0], help=given[1])
    return p


def machine(**more) -> dict:
    """Python's version and the platform, with `more` (cpus, load)."""
    return {"python": sys.version.split()[0], "platform": platform.platform(), **more}


def say(text: str) -> None:
    """A progress line: `[NAME HH:MM:SS] text`, NAME the benchmark's (its script's name)."""
    print(f"[{Path(sys.argv[0]).stem} {time.strftime('%H:%M:%S')}] {text}", flush=True)


def specs(env_id: str, **kw) -> tuple:
    """(observation spec, action spec) of `sim.make(env_id, **kw)`, the env closed again."""
    import sim  # not at the top: ros2_edge's echo peer runs from .venv/ros, without the sims

    with contextlib.closing(sim.make(env_id, **kw)) as env:
        return env.observation_spec(), env.action_spec()


def report(path: Path, result: dict, table: Callable[[dict], None]) -> dict:
    """`table(result)` printed, `result` written to `path` as JSON; returns `result`."""
    table(result)
    write_json(path, result)
    print(f"wrote {path}")
    return result
