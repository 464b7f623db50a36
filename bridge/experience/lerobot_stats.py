"""LeRobot's feature statistics (min, max, mean, std, count, q01 q10 q50 q90 q99), as lerobot 0.4.4 computes them.

    stats = episode_stats({"action": actions}, {"observation.images.top": frames})   # per episode
    total = aggregate([stats_ep0, stats_ep1, ...])                                    # meta/stats.json

    >>> s = feature_stats(np.array([[0.0], [1.0], [2.0], [3.0]]))
    >>> s["mean"].tolist(), s["count"].tolist(), round(float(s["q50"][0]), 3)
    ([1.5], [4], 1.0)
    >>> aggregate([{"x": s}, {"x": s}])["x"]["count"].tolist(), len(sample_indices(1000))
    ([8], 177)

Same semantics as `lerobot.datasets.compute_stats` (written from its behaviour, not copied): vectors per
dimension over the frames (a scalar column's stats have shape (1,)); camera frames per channel, (3, 1, 1), scaled
to [0, 1], over a sample of at most ~100 frames of the episode (`sample_indices`), downscaled when 300 px or
larger; quantiles from a 5000-bin histogram between min - 1e-10 and max + 1e-10, interpolated within the bin;
fewer than two rows: every quantile is the mean. Aggregation weights means, variances and quantiles by count.
One difference: image std is computed in floating point; lerobot 0.4.4 squares uint8 pixels in uint8, which
wraps, so its image std is too small (often 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["QUANTILES", "aggregate", "episode_stats", "feature_stats", "sample_indices"]

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
BINS = 5000


def sample_indices(n: int) -> list[int]:
    """The frames of an n-frame episode whose images enter its stats (lerobot: all up to 100, then ~n**0.75)."""
    k = min(n, 100) if n < 100 else max(100, min(int(n ** 0.75), 10_000))
    return np.round(np.linspace(0, n - 1, k)).astype(int).tolist()


def _quantile(hist: np.ndarray, edges: np.ndarray, target: float) -> float:
    cum = np.cumsum(hist)
    i = int(np.searchsorted(cum, target))
    if i == 0:
        return float(edges[0])
    if i >= len(cum):
        return float(edges[-1])
    before, inside = cum[i - 1], cum[i] - cum[i - 1]
    if inside == 0:
        return float(edges[i])
    return float(edges[i] + (target - before) / inside * (edges[i + 1] - edges[i]))


def _uint8_stats(rows: np.ndarray, count: int) -> dict[str, np.ndarray]:
    """`feature_stats` of uint8 rows (camera pixels) from one 256-value count per column: the same figures
    (the 5000-bin histogram is the value counts moved into their bins) without widening millions of pixels."""
    n, values = rows.shape[0], np.arange(256, dtype=np.float64)
    out: dict[str, list] = {k: [] for k in ("min", "max", "mean", "std", *QUANTILES)}
    for j in range(rows.shape[1]):
        counts = np.bincount(rows[:, j], minlength=256)
        present = np.flatnonzero(counts)
        lo, hi = int(present[0]), int(present[-1])
        mean = float(counts @ values) / n
        out["min"].append(lo)
        out["max"].append(hi)
        out["mean"].append(mean)
        out["std"].append(np.sqrt(max(0.0, float(counts @ values ** 2) / n - mean ** 2)))
        edges = np.linspace(lo - 1e-10, hi + 1e-10, BINS + 1)
        bins = np.searchsorted(edges, values[present], side="right") - 1  # np.histogram's half-open bins
        hist = np.bincount(bins, weights=counts[present], minlength=BINS)
        for k, q in QUANTILES.items():
            out[k].append(_quantile(hist, edges, q * n))
    return {"min": np.asarray(out["min"], np.uint8), "max": np.asarray(out["max"], np.uint8),
            **{k: np.asarray(v) for k, v in out.items() if k not in ("min", "max")}, "count": np.array([count])}


def feature_stats(rows: np.ndarray, *, count: int | None = None) -> dict[str, np.ndarray]:
    """Stats per column of `rows` (N, d); `count` (default N) is what `count` reports (images: frames, not pixels)."""
    n = rows.shape[0]
    count = n if count is None else count
    if n >= 2 and rows.dtype == np.uint8:
        return _uint8_stats(rows, count)
    if n < 2:
        out = {"min": rows.min(0), "max": rows.max(0), "mean": rows.mean(0), "std": rows.std(0)}
        return {**out, "count": np.array([count]), **{k: out["mean"].copy() for k in QUANTILES}}
    wide = rows.astype(np.float64) if rows.dtype == np.uint8 else rows
    mean = wide.mean(0)
    std = np.sqrt(np.maximum(0, (wide ** 2).mean(0) - mean ** 2))
    lo, hi = rows.min(0), rows.max(0)
    quantiles: dict[str, list[float]] = {k: [] for k in QUANTILES}
    for j in range(rows.shape[1]):
        edges = np.linspace(lo[j] - 1e-10, hi[j] + 1e-10, BINS + 1)
        column = rows[:, j].astype(np.uint8) if rows.dtype == np.bool_ else rows[:, j]
        hist, _ = np.histogram(column, bins=edges)
        for k, q in QUANTILES.items():
            quantiles[k].append(_quantile(hist, edges, q * n))
    out = {"min": lo, "max": hi, "mean": mean, "std": std, "count": np.array([count])}
    return {**out, **{k: np.asarray(v) for k, v in quantiles.items()}}


def _downscaled(frames: np.ndarray) -> np.ndarray:
    """(N, H, W, C) -> every k-th pixel when the larger side is 300 px or more (k: that side / 150)."""
    h, w = frames.shape[1:3]
    if max(h, w) < 300:
        return frames
    k = int(w / 150) if w > h else int(h / 150)
    return frames[:, ::k, ::k]


def episode_stats(columns: Mapping[str, np.ndarray], images: Mapping[str, np.ndarray]) -> dict[str, dict]:
    """One episode's stats: `columns` {feature: (N, ...) array}, `images` {feature: uint8 (N, H, W, 3)}."""
    out = {}
    for key, a in columns.items():
        rows = a.reshape(len(a), -1) if a.ndim <= 2 else a.reshape(-1, a.shape[-1])
        out[key] = feature_stats(rows, count=len(a))
    for key, frames in images.items():
        sampled = _downscaled(frames[sample_indices(len(frames))])
        s = feature_stats(sampled.reshape(-1, sampled.shape[-1]), count=len(sampled))
        out[key] = {k: v if k == "count" else (np.asarray(v, np.float64) / 255.0).reshape(-1, 1, 1)
                    for k, v in s.items()}
    return out


def aggregate(episodes: Sequence[Mapping[str, Mapping[str, np.ndarray]]]) -> dict[str, dict[str, np.ndarray]]:
    """The dataset's stats from its episodes' (lerobot's aggregate_stats): min of mins, max of maxes, the
    count-weighted mean, the pooled std, count-weighted quantiles."""
    keys = dict.fromkeys(k for ep in episodes for k in ep)
    total = {}
    for key in keys:
        group = [ep[key] for ep in episodes if key in ep]
        means = np.stack([s["mean"] for s in group])
        counts = np.stack([s["count"] for s in group])
        n = counts.sum(0)
        w = counts.reshape(counts.shape + (1,) * (means.ndim - counts.ndim))
        mean = (means * w).sum(0) / n
        var = ((np.stack([s["std"] for s in group]) ** 2 + (means - mean) ** 2) * w).sum(0) / n
        total[key] = {"min": np.min(np.stack([s["min"] for s in group]), 0),
                      "max": np.max(np.stack([s["max"] for s in group]), 0), "mean": mean, "std": np.sqrt(var),
                      "count": n, **{q: (np.stack([s[q] for s in group]) * w).sum(0) / n for q in QUANTILES}}
    return total


def to_json(stats: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
    """{feature: {stat: nested lists}} for stats.json and the episodes parquet."""
    return {k: {s: np.asarray(v).tolist() for s, v in group.items()} for k, group in stats.items()}
