"""Child process for the crash test: writes to a registry without pause, reporting each committed change on stdout
("<version> <step>"), until it is killed. It imports bridge.registry before anything else of the project."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bridge.registry import Registry, State  # noqa: E402
from tests.registry.helpers import POLICY, add, serving  # noqa: E402


def main(path: str) -> None:
    registry = serving(Registry(path))
    print("1 live", flush=True)
    checks = [{"name": f"check{i}", "passed": True, "figures": {"x": float(i)}, "detail": "d" * 2000}
              for i in range(8)]
    for version in range(2, 100_000):
        add(registry, version)
        print(version, "candidate", flush=True)
        registry.record_gate(POLICY, version, checks)
        print(version, "gate", flush=True)
        registry.move(POLICY, version, State.GATED, who="gate", why="passed")
        print(version, "gated", flush=True)
        registry.move(POLICY, version, State.LIVE, who="auto", why="direct")
        print(version, "live", flush=True)
        registry.pin(POLICY, f"session=s{version % 3}", version, who="operator:a", why="hold")
        print(version, "pinned", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
