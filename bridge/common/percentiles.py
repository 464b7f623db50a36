"""One percentile definition for every figure Tether prints: nearest rank.

The p-th percentile of n samples is the smallest sample with at least p% of the samples at or below
it: sorted(samples)[ceil(p/100 * n) - 1]. It is always one of the samples (a latency that happened,
never an interpolation between two), costs one sort, and needs no numpy. The console, `tether sim`,
the edge's report, the rollout monitor and the benchmarks all read their p50/p99 from here, so the
same samples give the same figures everywhere.

    >>> percentile(range(1, 101), 99)
    99
    >>> percentile([1, 2, 3, 4], 50)
    2
    >>> p50_p99([3.0, 1.0, 2.0])
    (2.0, 3.0)
    >>> summary_ms([1_000_000, 2_000_000, 3_000_000])
    {'p50': 2.0, 'p99': 3.0}
    >>> summary_ms([])
    {'p50': None, 'p99': None}
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

__all__ = ["p50_p99", "percentile", "percentile_sorted", "percentiles", "summary_ms"]


def percentile_sorted(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile `q` (0 < q <= 100) of already sorted, non-empty `ordered`.

    >>> percentile_sorted([10, 20, 30, 40, 50], 20)
    10
    >>> percentile_sorted([10, 20, 30, 40, 50], 21)
    20
    >>> percentile_sorted(range(1, 1001), 99.9)
    999
    """
    n = len(ordered)
    if n == 0:
        raise ValueError("a percentile of no samples")
    if not 0 < q <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {q!r}")
    rank = math.ceil(round(q * n / 100, 9))  # rounded first: 99.9% of 1000 is rank 999, not 1000
    return ordered[min(n, max(1, rank)) - 1]


def percentile(samples: Iterable[float], q: float) -> float:
    """Nearest-rank percentile `q` of `samples` (any iterable; must not be empty)."""
    return percentile_sorted(sorted(samples), q)


def percentiles(samples: Iterable[float], qs: Iterable[float]) -> list[float]:
    """Several nearest-rank percentiles of `samples` with one sort.

    >>> percentiles(range(1, 11), (10, 50, 90, 100))
    [1, 5, 9, 10]
    """
    ordered = sorted(samples)
    return [percentile_sorted(ordered, q) for q in qs]


def p50_p99(samples: Iterable[float], *, empty: float = 0.0) -> tuple[float, float]:
    """(p50, p99) of `samples`; (`empty`, `empty`) when there are none."""
    ordered = sorted(samples)
    if not ordered:
        return empty, empty
    return percentile_sorted(ordered, 50), percentile_sorted(ordered, 99)


def summary_ms(samples_ns: Iterable[int], *, digits: int = 3) -> dict[str, float | None]:
    """{'p50', 'p99'} in milliseconds (rounded to `digits`) of samples in nanoseconds; None when empty."""
    ordered = sorted(samples_ns)
    if not ordered:
        return {"p50": None, "p99": None}
    return {"p50": round(percentile_sorted(ordered, 50) / 1e6, digits),
            "p99": round(percentile_sorted(ordered, 99) / 1e6, digits)}
