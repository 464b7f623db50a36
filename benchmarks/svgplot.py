"""A dependency-free SVG line plot for benchmark results (a picture beats a table of percentiles).

    svg = line_plot({"raw": (xs, ys), "gateway": (xs2, ys2)}, x_label="ms", y_label="fraction")
    Path("out.svg").write_text(svg)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def cdf(samples: Sequence[float], *, clip_quantile: float = 0.995) -> tuple[np.ndarray, np.ndarray]:
    """Sorted samples (up to a high quantile, so one stall does not flatten the plot) and their CDF."""
    xs = np.sort(np.asarray(samples, dtype=float))
    ys = np.arange(1, len(xs) + 1) / len(xs)
    keep = ys <= clip_quantile
    return xs[keep], ys[keep]


def line_plot(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *, title: str = "",
              x_label: str = "", y_label: str = "", width: int = 640, height: int = 400,
              markers: Sequence[tuple[float, str]] = ()) -> str:
    """`markers`: (x, label) pairs drawn as dashed vertical lines (e.g. where a new version went live)."""
    left, right, top, bottom = 60, 20, 40, 50
    xs_all = np.concatenate([np.asarray(x, float) for x, _ in series.values()])
    ys_all = np.concatenate([np.asarray(y, float) for _, y in series.values()])
    x0, x1 = 0.0, float(xs_all.max()) * 1.05 or 1.0
    y0, y1 = min(0.0, float(ys_all.min())), float(ys_all.max()) * 1.05 or 1.0

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{left}" y1="{py(y0)}" x2="{width - right}" y2="{py(y0)}" stroke="black"/>',
           f'<line x1="{left}" y1="{py(y0)}" x2="{left}" y2="{top}" stroke="black"/>']
    for tick in np.linspace(x0, x1, 6):
        out.append(f'<text x="{px(tick):.1f}" y="{height - bottom + 16}" text-anchor="middle">{tick:.2f}</text>')
    for tick in np.linspace(y0, y1, 6):
        out.append(f'<text x="{left - 6}" y="{py(tick) + 4:.1f}" text-anchor="end">{tick:.2f}</text>')
    out.append(f'<text x="{width / 2}" y="{height - 12}" text-anchor="middle">{x_label}</text>')
    out.append(f'<text x="16" y="{height / 2}" text-anchor="middle" transform="rotate(-90 16 {height / 2})">'
               f'{y_label}</text>')
    for i, (x, label) in enumerate(markers):
        out.append(f'<line x1="{px(x):.1f}" y1="{py(y0)}" x2="{px(x):.1f}" y2="{top}" stroke="#999" '
                   f'stroke-dasharray="3,3"/>')
        out.append(f'<text x="{px(x) + 2:.1f}" y="{top + 10 + 11 * (i % 4)}" fill="#777" font-size="10">{label}</text>')
    for i, (name, (x, y)) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        points = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in zip(x, y, strict=True))
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{points}"/>')
        legend_y = height - bottom - 12 - 16 * (len(series) - 1 - i)  # bottom right: empty under a CDF
        out.append(f'<text x="{width - right - 150}" y="{legend_y}" fill="{color}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out)
