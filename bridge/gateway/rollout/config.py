"""The gateway's rollout settings: the plan a gated version follows, the registry file, the gate.

    plan = RolloutPlan(mode="staged", shadow_steps=200, canary_fraction=0.25, canary_episodes=10)
    registry = open_registry(None, ModelRepository("runs/models"))   # runs/models/.tether/registry.sqlite

On the command line (`tether gateway`): --rollout direct|staged, --shadow-steps, --canary-fraction,
--canary-labels k=v[,k=v], --canary-episodes, --registry PATH|postgresql://... (--registry-passfile PATH: the
password, never in the URL), --gate-eval-env ENV,
--gate-eval-episodes K, --gate-eval-margin M, --gate-max-jerk J.

    >>> RolloutPlan(mode="fast")
    Traceback (most recent call last):
    ...
    ValueError: rollout mode must be one of ('direct', 'staged'), got 'fast'
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bridge.gate import GateConfig
from bridge.registry import Registry, RegistryError, Thresholds, is_url, parse_labels
from bridge.registry.backends import with_passfile
from inference_server import ModelRepository

MODES = ("direct", "staged")
REGISTRY_FILE = Path(".tether") / "registry.sqlite"


@dataclass(frozen=True, kw_only=True)
class RolloutPlan:
    """What happens to a version once the gate passed it. `direct`: live at once (the learning
    loop; no runtime judging of live). `staged`: shadow for `shadow_steps` compared steps, canary
    (`canary_labels` when given, else `canary_fraction` of sessions) for `canary_episodes` episodes,
    then live unless the RegressionMonitor finds a regression vs the live version (then
    rolled_back, automatically); a version promoted to live (by the plan or an operator) that then
    regresses vs the previous live one is rolled back (a version restored by a rollback is not judged)."""

    mode: str = "direct"
    shadow_steps: int = 200
    canary_fraction: float = 0.25
    canary_labels: Mapping[str, str] = field(default_factory=dict)
    canary_episodes: int = 10
    thresholds: Thresholds = field(default_factory=Thresholds)
    tick_s: float = 0.1             # how often the controller judges and advances

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"rollout mode must be one of {MODES}, got {self.mode!r}")
        for name in ("shadow_steps", "canary_episodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not 0.0 <= self.canary_fraction <= 1.0:
            raise ValueError(f"canary_fraction must be in [0, 1], got {self.canary_fraction!r}")
        if not self.tick_s > 0:
            raise ValueError(f"tick_s must be > 0, got {self.tick_s!r}")


def open_registry(path: Path | str | None, repository: ModelRepository | None) -> Registry:
    """`path` (a SQLite file, or a postgresql:// URL several gateways share), else the repository's own
    (<root>/.tether/registry.sqlite), else an in-memory one."""
    if is_url(path):
        return Registry(path)
    if path is None and repository is not None:
        path = repository.root / REGISTRY_FILE
    if path is None:
        return Registry(":memory:")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return Registry(path)


def registry_location(text: str) -> Path | str:
    """--registry: a postgresql:// URL stays a string (a Path would fold its "//"), anything else is a file.

    >>> registry_location("postgresql://tether@db:5432/tether"), registry_location("runs/registry.sqlite")
    ('postgresql://tether@db:5432/tether', PosixPath('runs/registry.sqlite'))
    """
    return text if is_url(text) else Path(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rollout and gate")
    g.add_argument("--rollout", choices=MODES, default="direct",
                   help="direct: a gated version goes live at once; staged: shadow -> canary -> live")
    g.add_argument("--shadow-steps", type=int, default=200, help="staged: steps compared in shadow")
    g.add_argument("--canary-fraction", type=float, default=0.25, help="staged: fraction of sessions in canary")
    g.add_argument("--canary-labels", default="", metavar="K=V[,K=V]", help="staged: canary these sessions instead")
    g.add_argument("--canary-episodes", type=int, default=10, help="staged: canary episodes before live")
    g.add_argument("--registry", type=registry_location, metavar="PATH|URL",
                   help="the registry: a SQLite file (default: <model-repository>/.tether/registry.sqlite) or "
                        "postgresql://USER@HOST:PORT/DB, shared by several gateways (never with a password in it)")
    g.add_argument("--registry-passfile", type=Path, metavar="PATH",
                   help="the libpq passfile (*:*:*:USER:PASSWORD, mode 0600) holding the password of the --registry "
                        "URL's user (default: $PGPASSFILE)")
    g.add_argument("--gate-eval-env", help="evaluate candidates in this env vs the incumbent (tether sim)")
    g.add_argument("--gate-eval-episodes", type=int, default=5, help="episodes each version plays in the gate")
    g.add_argument("--gate-eval-margin", type=float, default=0.1,
                   help="a candidate fails below the incumbent's mean return - margin * |that mean|")
    g.add_argument("--gate-max-jerk", type=float, help="action sanity: max |a_t - a_t-1| / range")


def from_arguments(a: argparse.Namespace) -> dict:
    """GatewayConfig keyword arguments (rollout=, registry=, gate=) from the parsed flags."""
    try:
        plan = RolloutPlan(mode=a.rollout, shadow_steps=a.shadow_steps, canary_fraction=a.canary_fraction,
                           canary_labels=parse_labels(a.canary_labels), canary_episodes=a.canary_episodes)
        gate = GateConfig(eval_env=a.gate_eval_env, eval_episodes=a.gate_eval_episodes,
                          eval_margin=a.gate_eval_margin, max_jerk=a.gate_max_jerk)
    except ValueError as exc:
        raise SystemExit(f"tether gateway: {exc}") from None
    return {"rollout": plan, "registry": registry_with_passfile(a.registry, getattr(a, "registry_passfile", None)),
            "gate": gate}


def registry_with_passfile(registry: Path | str | None, passfile: Path | None) -> Path | str | None:
    """--registry with --registry-passfile folded into the URL (libpq's `passfile`); SystemExit when the URL carries
    a password or the passfile is given without a URL or is missing (the message masks any password)."""
    if not is_url(registry):
        if passfile is not None:
            raise SystemExit("tether gateway: --registry-passfile needs --registry postgresql://USER@HOST:PORT/DB")
        return registry
    try:
        return with_passfile(registry, passfile)
    except RegistryError as exc:
        raise SystemExit(f"tether gateway: {exc}") from None
