"""The figures and the verdict of one env's eval, judged by the gate's own checks (`bridge.gate.checks`).

    >>> t = Thresholds(min_return=100.0, max_regression=parse_regression("10%"))
    >>> t.max_regression
    Regression(value=0.1, relative=True)
    >>> parse_regression("25")
    Regression(value=25.0, relative=False)

Checks (one JUnit test case each, named `<env>.<check>`):
- `errors`: always judged: no step errors (refused sessions, bad actions, deadlines) in any episode.
- `min_return`: the candidate's mean return >= `--min-return`.
- `regression`: the gate's evaluation rule on the same seeds (`checks.evaluation`): candidate mean >=
  baseline mean - allowed, allowed = `--max-regression` as a fraction of |baseline mean| ("10%") or in
  return units (a plain number); the paired difference and its 95% t interval are reported beside it.
- `bound_violations`: steps whose raw action left the env's declared bounds (the gate's action_sanity
  rule: outside [low - tol * width, high + tol * width]) <= `--max-bound-violations`.
- `p99_latency`: the round trip of a step (observation out, action back) at p99 <= `--max-p99-ms`.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.common.percentiles import percentile
from bridge.gate import checks
from tether.evaluation.episodes import EnvRun

__all__ = ["Check", "Regression", "Thresholds", "figures", "judge", "parse_regression"]


@dataclass(frozen=True)
class Regression:
    value: float
    relative: bool  # True: a fraction of |baseline mean|; False: return units


def parse_regression(text: str) -> Regression:
    """`--max-regression`: "10%" (of |baseline mean|) or "25" (return units); ValueError naming the value."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ValueError(f"--max-regression {text!r}: expected a percentage such as 10% or a return such as 25"
                         ) from None
    if not 0 <= value < float("inf"):
        raise ValueError(f"--max-regression {text!r} must be a finite value >= 0")
    return Regression(value, raw.endswith("%"))


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    min_return: float | None = None
    max_regression: Regression | None = None
    max_bound_violations: int | None = None
    max_p99_ms: float | None = None
    bound_tolerance: float = 1e-6


@dataclass(frozen=True)
class Check:
    env: str
    name: str
    passed: bool
    detail: str
    figures: dict

    def to_dict(self) -> dict:
        return {"env": self.env, "check": self.name, "passed": self.passed, "detail": self.detail,
                "figures": self.figures}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def figures(run: EnvRun, *, bound_tolerance: float = 1e-6) -> dict:
    """JSON-ready figures of one run: returns (mean, 95% t interval), lengths, bounds, jerk, latency, errors."""
    mean, low, high = checks.mean_interval(run.returns)
    sanity = checks.action_sanity(run.actions, run.action_spec, pairs=run.pairs, bound_tolerance=bound_tolerance)
    rtt_ms = sorted(ns / 1e6 for ns in run.rtt_ns)
    return {
        "policy": run.policy, "episodes": len(run.returns), "seeds": list(run.seeds),
        "returns": [float(r) for r in run.returns], "lengths": list(run.lengths),
        "return_mean": mean, "return_ci95": [low, high], "length_mean": sum(run.lengths) / len(run.lengths),
        "steps": run.steps, "bound_violations": int(sanity.figures["out_of_bounds_samples"]),
        "non_finite_actions": int(sanity.figures["non_finite_samples"]),
        "jerk": sanity.figures["mean_jerk2"], "max_step": sanity.figures["max_jerk"],
        "latency_ms": {"p50": percentile(rtt_ms, 50) if rtt_ms else None,
                       "p99": percentile(rtt_ms, 99) if rtt_ms else None, "exchanges": len(rtt_ms)},
        "errors": dict(run.errors), "policy_versions": {str(v): n for v, n in sorted(run.versions.items())},
        "seconds": round(run.elapsed_s, 3),
        "episodes_per_min": round(60 * len(run.returns) / run.elapsed_s, 2) if run.elapsed_s > 0 else None,
    }


def judge(env: str, candidate: EnvRun, baseline: EnvRun | None, thresholds: Thresholds) -> tuple[dict, list[Check]]:
    """The env's figures (candidate, baseline, paired) and its checks."""
    result = {"env": env, "candidate": figures(candidate, bound_tolerance=thresholds.bound_tolerance)}
    c = result["candidate"]
    found: list[Check] = []
    errors = sum(candidate.errors.values())
    found.append(Check(env, "errors", errors == 0,
                       f"{errors} step errors {dict(candidate.errors)}" if errors else
                       f"no step errors in {c['episodes']} episodes ({c['steps']} steps)", {"errors": errors}))
    if baseline is not None:
        result["baseline"] = figures(baseline, bound_tolerance=thresholds.bound_tolerance)
        margin = thresholds.max_regression or Regression(0.0, True)
        rule = checks.evaluation(candidate.returns, baseline.returns, margin=margin.value, absolute=not margin.relative)
        f = rule.figures
        result["paired"] = {"differences": [a - b for a, b in zip(candidate.returns, baseline.returns, strict=True)],
                            "mean": f.get("difference_mean"),
                            "ci95": [f.get("difference_low"), f.get("difference_high")],
                            "relative": f["difference_mean"] / abs(f["incumbent_mean"])
                            if f.get("difference_mean") is not None and f["incumbent_mean"] else None}
        if thresholds.max_regression is not None:
            names = {"candidate_mean": "candidate_mean", "incumbent_mean": "baseline_mean", "threshold": "threshold",
                     "difference_mean": "difference_mean", "difference_low": "difference_ci95_low",
                     "difference_high": "difference_ci95_high"}
            found.append(Check(env, "regression", rule.passed, rule.detail.replace("incumbent", "baseline"),
                               {new: f[old] for old, new in names.items() if old in f}))
    if thresholds.min_return is not None:
        ok = c["return_mean"] >= thresholds.min_return
        found.append(Check(env, "min_return", ok, f"mean return {c['return_mean']:.4g} (95% CI "
                           f"{c['return_ci95'][0]:.4g}..{c['return_ci95'][1]:.4g}) "
                           f"{'>=' if ok else '<'} {thresholds.min_return:g}",
                           {"return_mean": c["return_mean"], "min_return": thresholds.min_return}))
    if thresholds.max_bound_violations is not None:
        n = c["bound_violations"]
        ok = n <= thresholds.max_bound_violations
        found.append(Check(env, "bound_violations", ok, f"{n} of {c['steps']} actions outside the declared bounds "
                           f"{'<=' if ok else '>'} {thresholds.max_bound_violations}",
                           {"bound_violations": n, "max_bound_violations": thresholds.max_bound_violations}))
    if thresholds.max_p99_ms is not None:
        p99 = c["latency_ms"]["p99"]
        ok = p99 is not None and p99 <= thresholds.max_p99_ms
        found.append(Check(env, "p99_latency", ok, f"step round trip p99 {_ms(p99)} ms "
                           f"{'<=' if ok else '>'} {thresholds.max_p99_ms:g} ms",
                           {"p99_ms": p99 if p99 is not None else -1.0, "max_p99_ms": thresholds.max_p99_ms}))
    result["checks"] = [check.to_dict() for check in found]
    return result, found
