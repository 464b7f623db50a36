"""The gate's verdicts and the pure computations behind them (no Triton, no processes).

    >>> import numpy as np, torch
    >>> check = integrity({"w": torch.tensor([1.0, float("nan")])}, {"w": torch.zeros(2)})
    >>> check.name, check.passed, check.detail
    ('integrity', False, "weight 'w' has 1 non-finite values")
    >>> compare_outputs({"action": np.ones((2, 1), np.float32)},
    ...                 {"action": np.full((2, 1), 1.5, np.float32)}).passed
    False
    >>> report = GateReport((check, CheckResult.skipped("evaluation", "no eval env configured")))
    >>> report.passed, report.failed
    (False, ['integrity'])
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from protos.codec import Spec

if TYPE_CHECKING:
    import torch

CHECKS = ("integrity", "consistency", "evaluation", "action_sanity")

# (rtol, atol) per dtype of the compared outputs: served vs the trainer's, |d| <= atol + rtol * |want|
DEFAULT_TOLERANCES: Mapping[str, tuple[float, float]] = MappingProxyType({
    "float64": (1e-7, 1e-7), "float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (1e-2, 1e-2),
    "int64": (0.0, 0.0), "int32": (0.0, 0.0), "uint8": (0.0, 0.0), "bool": (0.0, 0.0)})
# per serving format (by its name in inference_server.formats; one not here gets DEFAULT_TOLERANCES), over
# DEFAULT_TOLERANCES (docs/versions.md, "Consistency tolerance per serving format"):
# torch serves the trainer's own float32 kernels (measured max abs difference 0.0), onnxruntime its own
# (measured up to 3.8e-6 on the demo MLPs' action_mean, |values| <= 3): ~10x margin each
SERVING_TOLERANCES: Mapping[str, Mapping[str, tuple[float, float]]] = MappingProxyType({
    "torchscript": MappingProxyType({"float32": (1e-5, 1e-5)}),
    "onnx": MappingProxyType({"float32": (1e-5, 4e-5)})})


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict: its name, whether it passed, its figures and why."""

    name: str
    passed: bool
    figures: dict[str, float] = field(default_factory=dict)
    detail: str = ""

    def __post_init__(self):
        if self.name not in CHECKS:
            raise ValueError(f"check name {self.name!r} is not one of {CHECKS}")
        bad = [k for k, v in self.figures.items() if not isinstance(v, int | float) or isinstance(v, bool)]
        if bad:
            raise ValueError(f"check {self.name!r}: figures {bad} are not numbers")

    @classmethod
    def skipped(cls, name: str, why: str) -> CheckResult:
        """A check that could not run here: it passes, with no figures, saying why."""
        return cls(name, True, {}, f"skipped: {why}")

    @property
    def is_skipped(self) -> bool:
        return self.passed and self.detail.startswith("skipped:")

    def to_dict(self) -> dict:
        """JSON-ready (non-finite figures become strings "nan" / "inf" / "-inf")."""
        return {"name": self.name, "passed": self.passed, "detail": self.detail,
                "figures": {k: (float(v) if math.isfinite(v) else str(float(v))) for k, v in self.figures.items()}}


@dataclass(frozen=True)
class GateReport:
    """Every check run on one candidate, in order."""

    checks: tuple[CheckResult, ...]

    def __post_init__(self):
        object.__setattr__(self, "checks", tuple(self.checks))

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]

    def get(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    def summary(self) -> str:
        """One line: 'integrity ok, consistency FAILED (why), ...'."""
        return ", ".join(f"{c.name} {'ok' if c.passed else 'FAILED'}" + ("" if c.passed else f" ({c.detail})")
                         for c in self.checks)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "failed": self.failed, "checks": [c.to_dict() for c in self.checks]}


def integrity(weights: Mapping[str, torch.Tensor], architecture: Mapping[str, torch.Tensor] | None, *,
              sha256: str | None = None, data: bytes | None = None, digest: str | None = None,
              max_named: int = 5) -> CheckResult:
    """Expected tensor names, dtypes and shapes (against `architecture`'s state dict, when given),
    every value finite, and (given `sha256` and `data`, or the `digest` of the bytes computed as they
    arrived) the digest. Names each bad tensor."""
    import torch  # here, not at import: the gateway's config and CLI import this package
    problems: list[str] = [] if weights else ["the artifact holds no tensors"]
    figures: dict[str, float] = {"tensors": float(len(weights))}
    if sha256 is not None and (data is not None or digest is not None):
        digest = digest.lower() if digest is not None else hashlib.sha256(data).hexdigest()
        figures["sha256_ok"] = float(digest == sha256.lower())
        if digest != sha256.lower():
            problems.append(f"sha256 mismatch: the bytes hash to {digest}, the header says {sha256}")
    if architecture is not None:
        missing = sorted(architecture.keys() - weights.keys())
        unexpected = sorted(weights.keys() - architecture.keys())
        if missing:
            problems.append(f"missing tensors {missing[:max_named]}")
        if unexpected:
            problems.append(f"unexpected tensors {unexpected[:max_named]}")
        for name in sorted(architecture.keys() & weights.keys()):
            got, want = weights[name], architecture[name]
            if tuple(got.shape) != tuple(want.shape):
                problems.append(f"weight {name!r} has shape {list(got.shape)}, the architecture {list(want.shape)}")
            if got.dtype != want.dtype:
                problems.append(f"weight {name!r} has dtype {got.dtype}, the architecture {want.dtype}")
    non_finite, parameters = 0, 0
    for name in sorted(weights):
        tensor = weights[name]
        if not isinstance(tensor, torch.Tensor):
            problems.append(f"weight {name!r} is a {type(tensor).__name__}, not a tensor")
            continue
        parameters += tensor.numel()
        if tensor.is_floating_point() or tensor.is_complex():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                non_finite += bad
                problems.append(f"weight {name!r} has {bad} non-finite values")
    figures.update(parameters=float(parameters), non_finite=float(non_finite))
    if not problems:
        compared = "against the architecture" if architecture is not None else "(no architecture to compare with)"
        return CheckResult("integrity", True, figures, f"{len(weights)} tensors, all finite, names/dtypes/shapes "
                                                       f"{'match' if architecture is not None else 'unchecked'} "
                                                       f"{compared}")
    more = f" (and {len(problems) - max_named} more)" if len(problems) > max_named else ""
    return CheckResult("integrity", False, figures, "; ".join(problems[:max_named]) + more)


def _dtype_name(dtype: np.dtype | torch.dtype | str) -> str:
    if type(dtype).__module__ == "torch":  # a torch.dtype, without importing torch
        return str(dtype).removeprefix("torch.")
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def tolerance_for(dtypes: Iterable[np.dtype | torch.dtype | str],
                  tolerances: Mapping[str, tuple[float, float]]) -> tuple[float, float]:
    """The loosest (rtol, atol) among `dtypes` (an unknown dtype: ValueError naming it)."""
    rtol, atol = 0.0, 0.0
    for dtype in dtypes:
        key = _dtype_name(dtype)
        if key not in tolerances:
            raise ValueError(f"no tolerance configured for dtype {key!r} (configured: {sorted(tolerances)})")
        r, a = tolerances[key]
        rtol, atol = max(rtol, r), max(atol, a)
    return rtol, atol


def compare_outputs(served: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], *,
                    tolerances: Mapping[str, tuple[float, float]] = DEFAULT_TOLERANCES,
                    atol: float = 0.0, extra_dtypes: Sequence[str] = ()) -> CheckResult:
    """Numerical consistency: every expected output within |d| <= atol + rtol * |want| of the served one.

    (rtol, atol) is the loosest of the outputs' dtypes and `extra_dtypes` (e.g. the weights'); a
    positive `atol` (the publisher's header.atol) replaces it with that absolute tolerance.
    Figures: max_abs_error, max_rel_error (|d| / |want| where |want| > the absolute tolerance),
    worst (the largest |d| / allowed: <= 1 passes), rtol, atol, outputs.
    """
    figures = {"max_abs_error": 0.0, "max_rel_error": 0.0, "worst": 0.0, "rtol": 0.0, "atol": 0.0,
               "outputs": float(len(expected))}
    problems: list[str] = []
    for key in sorted(expected):
        want = np.asarray(expected[key])
        if key not in served:
            problems.append(f"output {key!r} is not served")
            continue
        got = np.asarray(served[key])
        if got.shape != want.shape:
            problems.append(f"output {key!r}: served shape {list(got.shape)}, the reference {list(want.shape)}")
            continue
        if atol > 0:
            r, a = 0.0, float(atol)
        else:
            r, a = tolerance_for([got.dtype, want.dtype, *extra_dtypes], tolerances)
        figures["rtol"], figures["atol"] = max(figures["rtol"], r), max(figures["atol"], a)
        got64, want64 = got.astype(np.float64), want.astype(np.float64)
        if not np.isfinite(got64).all():
            problems.append(f"output {key!r}: the served values are not all finite")
            figures["max_abs_error"] = figures["worst"] = math.inf
            continue
        if not want.size:
            continue
        diff = np.abs(got64 - want64)
        allowed = a + r * np.abs(want64)
        abs_err = float(diff.max())
        big = np.abs(want64) > max(a, 1e-12)
        rel_err = float((diff[big] / np.abs(want64[big])).max()) if big.any() else 0.0
        worst = float(np.max(np.where(allowed > 0, diff / np.where(allowed > 0, allowed, 1.0),
                                      np.where(diff > 0, np.inf, 0.0))))
        figures["max_abs_error"] = max(figures["max_abs_error"], abs_err)
        figures["max_rel_error"] = max(figures["max_rel_error"], rel_err)
        figures["worst"] = max(figures["worst"], worst)
        if worst > 1.0:
            problems.append(f"output {key!r}: max abs error {abs_err:.3g}, max rel error {rel_err:.3g} exceed "
                            f"the tolerance (atol {a:g} + rtol {r:g} * |reference|)")
    if problems:
        return CheckResult("consistency", False, figures,
                           "; ".join(problems) + ": a wrong export, a dtype slip or stale weights")
    return CheckResult("consistency", True, figures,
                       f"{len(expected)} output(s) within tolerance: max abs error {figures['max_abs_error']:.3g}, "
                       f"max rel error {figures['max_rel_error']:.3g}")


def _bounds(spec: Spec) -> tuple[np.ndarray, np.ndarray]:
    """Low/high of `spec` broadcast to its shape (-inf/+inf where it declares none): `Spec.bounds`."""
    return spec.bounds()


def with_bounds(outputs: Sequence[Spec], declared: Iterable[Sequence[Spec]]) -> tuple[Spec, ...]:
    """`outputs` (e.g. Triton's specs, which carry no bounds) with the bounds the sessions declared
    for the same tensors; where sessions differ, the tightest (every robot's limits hold).

    >>> out = (Spec("action", np.float32, (2,)),)
    >>> arm = (Spec("action", np.float32, (2,), low=(-1.0, -2.0), high=(1.0, 2.0)),)
    >>> sim = (Spec("action", np.float32, (2,), low=(-3.0,), high=(0.5,)),)
    >>> spec = with_bounds(out, [arm, sim])[0]
    >>> spec.low, spec.high
    ((-1.0, -2.0), (0.5, 0.5))
    """
    found: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for specs in declared:
        for spec in specs:
            if not (spec.low or spec.high):
                continue
            try:
                low, high = _bounds(spec)
            except ValueError:  # a count that fits no shape (refused at Hello: never judged by)
                continue
            if np.isnan(low).any() or np.isnan(high).any() or (low > high).any():  # ditto: never loosens the check
                continue
            if spec.name in found and found[spec.name][0].shape == low.shape:
                low, high = np.maximum(found[spec.name][0], low), np.minimum(found[spec.name][1], high)
            found[spec.name] = (low, high)
    merged = []
    for spec in outputs:
        bounds = found.get(spec.name)
        if bounds is None or bounds[0].shape != tuple(spec.shape):
            merged.append(spec)
            continue
        low, high = bounds
        merged.append(Spec(spec.name, spec.dtype, spec.shape, low=tuple(low.ravel().tolist()),
                           high=tuple(high.ravel().tolist())))
    return tuple(merged)


def action_sanity(actions: Mapping[str, np.ndarray], action_spec: Sequence[Spec], *,
                  pairs: Sequence[tuple[int, int]] = (), bound_tolerance: float = 1e-6,
                  max_jerk: float | None = None, sampled: Mapping[str, np.ndarray] | None = None) -> CheckResult:
    """Bounds, finiteness and jerk of a batch of actions (leading dimension: samples).

    A stochastic policy's actions here are its means (`<name>_mean`: what it intends; its samples
    spread around them and the actuator clips them); `sampled` are its samples: only their
    finiteness is judged.

    An element is out of bounds when below low - tol * width or above high + tol * width (width =
    high - low; an absolute tol where a side is unbounded). `pairs` are (previous, next) row indices
    of consecutive logged steps of one episode; jerk = max |a_next - a_prev| / width (raw where the
    width is not finite). Fails on any out-of-bounds or non-finite action, or jerk > max_jerk.
    Also reported, not judged here (`tether eval` reads them): `out_of_bounds_samples` (a count) and
    `mean_jerk2`, the mean |a_t+1 - 2 a_t + a_t-1| / width over three consecutive steps (chains of `pairs`).
    """
    samples = max((len(a) for a in actions.values()), default=0)
    elements, bounded = 0, 0
    out_rows = np.zeros(samples, bool)
    nonfinite_rows = np.zeros(samples, bool)
    jerk = 0.0
    jerk2_sum, jerk2_count = 0.0, 0
    triples = _triples(pairs, samples)
    problems: list[str] = []
    for spec in action_spec:
        if spec.name not in actions:
            problems.append(f"action {spec.name!r} is not served")
            continue
        a = np.asarray(actions[spec.name], np.float64).reshape(len(actions[spec.name]), *spec.shape)
        low, high = _bounds(spec)
        elements += low.size
        bounded += int((np.isfinite(low) | np.isfinite(high)).sum())
        width = high - low
        slack = np.where(np.isfinite(width), bound_tolerance * width, bound_tolerance)
        finite = np.isfinite(a)
        nonfinite_rows |= ~finite.reshape(len(a), -1).all(axis=1)
        with np.errstate(invalid="ignore"):
            outside = finite & ((a < low - slack) | (a > high + slack))
        rows = outside.reshape(len(a), -1).any(axis=1)
        if rows.any():
            worst = int(np.argmax(rows))
            problems.append(f"action {spec.name!r} leaves its bounds [{spec.low}, {spec.high}] in {int(rows.sum())} "
                            f"of {len(a)} samples (e.g. {a[worst].ravel()[:4].tolist()})")
        out_rows |= rows
        if pairs:
            prev, nxt = np.asarray(pairs).T
            scale = np.where(np.isfinite(width) & (width > 0), width, 1.0)
            steps = np.abs(a[nxt] - a[prev]) / scale
            steps = steps[np.isfinite(steps)]
            if steps.size:
                jerk = max(jerk, float(steps.max()))
        if triples is not None:
            p, q, r = triples
            scale = np.where(np.isfinite(width) & (width > 0), width, 1.0)
            second = np.abs(a[r] - 2 * a[q] + a[p]) / scale
            second = second[np.isfinite(second)]
            jerk2_sum, jerk2_count = jerk2_sum + float(second.sum()), jerk2_count + int(second.size)
    if nonfinite_rows.any():
        problems.append(f"{int(nonfinite_rows.sum())} of {samples} samples have non-finite actions")
    for name, values in (sampled or {}).items():  # rows as in `actions`
        bad = ~np.isfinite(np.asarray(values, np.float64)).reshape(samples, -1).all(axis=1)
        if bad.any():
            problems.append(f"{int(bad.sum())} of {samples} sampled {name!r} actions are not finite")
        nonfinite_rows |= bad
    if max_jerk is not None and jerk > max_jerk:
        problems.append(f"max jerk {jerk:.3g} (of the bound range, between consecutive steps) exceeds {max_jerk:g}")
    figures = {"samples": float(samples), "pairs": float(len(pairs)),
               "out_of_bounds": float(out_rows.mean()) if samples else 0.0,
               "non_finite": float(nonfinite_rows.mean()) if samples else 0.0, "max_jerk": jerk,
               "bounded": bounded / elements if elements else 0.0,
               "out_of_bounds_samples": float(out_rows.sum()), "non_finite_samples": float(nonfinite_rows.sum()),
               "mean_jerk2": jerk2_sum / jerk2_count if jerk2_count else 0.0}
    if problems:
        return CheckResult("action_sanity", False, figures, "; ".join(problems))
    judged = f", max jerk {jerk:.3g} <= {max_jerk:g}" if max_jerk is not None else f", max jerk {jerk:.3g} (not judged)"
    means = f" (judged on the means {sorted(f'{n}_mean' for n in sampled)}; samples finite)" if sampled else ""
    where = "within bounds" if bounded == elements else "within bounds where declared" if bounded else \
        "(the action spec declares no bounds: none judged)"
    return CheckResult("action_sanity", True, figures,
                       f"{samples} recorded observations: all actions finite and {where}{judged}{means}")


def _triples(pairs: Sequence[tuple[int, int]], samples: int) -> tuple[np.ndarray, ...] | None:
    """(p, q, r) row indices of three consecutive steps, chained from (previous, next) `pairs`."""
    if len(pairs) < 2:
        return None
    prev, nxt = np.asarray(pairs, np.int64).T
    successor = np.full(samples, -1, np.int64)
    successor[prev] = nxt
    third = successor[nxt]
    keep = third >= 0
    return (prev[keep], nxt[keep], third[keep]) if keep.any() else None


# two-sided 95% Student t quantiles t(0.975, df) for df = 1..30; beyond, a Cornish-Fisher expansion
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t_critical_95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with `df` degrees of freedom (table to 30, then an
    expansion accurate to 1e-3).

    >>> t_critical_95(4), round(t_critical_95(100), 3)
    (2.776, 1.984)
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95% Student t confidence interval (low = high = mean for one value).

    >>> [round(x, 3) for x in mean_interval([1.0, 2.0, 3.0])]
    [2.0, -0.484, 4.484]
    """
    v = np.asarray(values, np.float64)
    if not v.size:
        raise ValueError("no values to take the mean of")
    mean = float(v.mean())
    if v.size < 2:
        return mean, mean, mean
    half = t_critical_95(v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return mean, mean - half, mean + half


def evaluation(candidate: Sequence[float], incumbent: Sequence[float], *, margin: float,
               absolute: bool = False) -> CheckResult:
    """Fails when mean(candidate) < mean(incumbent) - margin * |mean(incumbent)| (same seeds); with
    `absolute`, when mean(candidate) < mean(incumbent) - margin (return units).

    Where both ran the same episodes (equal counts, the i-th of each on the same seed) the figures add
    the paired difference candidate - incumbent: `difference_mean` (the same number as the difference
    of the means: the verdict is unchanged) and its 95% t interval `difference_low`/`difference_high`.
    """
    c, i = np.asarray(candidate, np.float64), np.asarray(incumbent, np.float64)
    if not c.size or not i.size:
        return CheckResult("evaluation", False, {"episodes": float(min(c.size, i.size))},
                           f"no episodes to compare (candidate {c.size}, incumbent {i.size})")
    c_mean, i_mean = float(c.mean()), float(i.mean())
    figures = {"episodes": float(c.size), "candidate_mean": c_mean, "candidate_std": float(c.std()),
               "incumbent_mean": i_mean, "incumbent_std": float(i.std()), "margin": float(margin)}
    if i_mean != 0:
        figures["ratio"] = c_mean / i_mean
    if c.size == i.size and np.isfinite(c).all() and np.isfinite(i).all():
        d_mean, d_low, d_high = mean_interval(c - i)
        figures.update(difference_mean=d_mean, difference_low=d_low, difference_high=d_high)
    threshold = i_mean - margin if absolute else i_mean - margin * abs(i_mean)
    figures["threshold"] = threshold
    allowed = f"{margin:g}" if absolute else f"{margin:g} * |incumbent mean|"
    rule = (f"rule: candidate mean >= incumbent mean - {allowed} = {threshold:.4g}; "
            f"candidate {c_mean:.4g} ± {figures['candidate_std']:.3g}, incumbent {i_mean:.4g} ± "
            f"{figures['incumbent_std']:.3g} over {c.size} episodes")
    if not np.isfinite(c).all():
        return CheckResult("evaluation", False, figures, f"non-finite candidate returns; {rule}")
    if not c_mean >= threshold:
        return CheckResult("evaluation", False, figures, f"the candidate performs worse than the incumbent: {rule}")
    return CheckResult("evaluation", True, figures, f"not worse than the incumbent: {rule}")
