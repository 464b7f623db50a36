"""An eval's outputs: the terminal table, the JSON document and a JUnit XML file (one test case per env
and check, a failure naming the env, the check and its figures), so any CI shows the verdict natively.

    >>> from tether.evaluation.verdict import Check
    >>> xml = junit([Check("Hopper-v5", "min_return", False, "mean return 12 < 100", {"return_mean": 12.0})],
    ...             seconds=3.0)
    >>> 'failures="1"' in xml and 'name="Hopper-v5.min_return"' in xml
    True
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from tether.evaluation.verdict import Check

__all__ = ["junit", "table"]


def _num(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def table(results: Sequence[dict], found: Sequence[Check]) -> str:
    """Figures per env (and per policy with a baseline), then one line per check."""
    rows = [("env", "policy", "episodes", "return mean [95% CI]", "length", "bound viol.", "jerk",
             "p50 ms", "p99 ms", "errors")]
    for r in results:
        for role in ("candidate", "baseline"):
            f = r.get(role)
            if f is None:
                continue
            rows.append((r["env"], f"{role[0]}:{f['policy']}", str(f["episodes"]),
                         f"{_num(f['return_mean'])} [{_num(f['return_ci95'][0])}, {_num(f['return_ci95'][1])}]",
                         _num(f["length_mean"]), str(f["bound_violations"]), _num(f["jerk"], 3),
                         _num(f["latency_ms"]["p50"], 3), _num(f["latency_ms"]["p99"], 3),
                         str(sum(f["errors"].values()))))
        if "paired" in r and r["paired"]["mean"] is not None:
            p = r["paired"]
            rel = "" if p["relative"] is None else f" ({100 * p['relative']:+.1f}%)"
            rows.append((r["env"], "c - b (paired)", str(len(p["differences"])),
                         f"{_num(p['mean'])} [{_num(p['ci95'][0])}, {_num(p['ci95'][1])}]{rel}",
                         "", "", "", "", "", ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines += [f"{'PASS' if c.passed else 'FAIL'}  {c.env}  {c.name}: {c.detail}" for c in found]
    return "\n".join(lines)


def junit(found: Sequence[Check], *, seconds: float, suite: str = "tether eval") -> str:
    """JUnit XML: one <testcase classname=ENV name=ENV.CHECK> per check; a failed one has a <failure>
    whose message names the env and the check and whose text lists the figures."""
    failures = sum(not c.passed for c in found)
    root = ET.Element("testsuites", name=suite, tests=str(len(found)), failures=str(failures), errors="0",
                      time=f"{seconds:.3f}")
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(found)), failures=str(failures), errors="0",
                       skipped="0", time=f"{seconds:.3f}")
    for c in found:
        case = ET.SubElement(ts, "testcase", classname=c.env, name=f"{c.env}.{c.name}", time="0")
        figures = "\n".join(f"{k} = {v}" for k, v in c.figures.items())
        if c.passed:
            ET.SubElement(case, "system-out").text = f"{c.detail}\n{figures}"
        else:
            failure = ET.SubElement(case, "failure", message=f"{c.env}: check {c.name} failed: {c.detail}",
                                    type=c.name)
            failure.text = f"env {c.env}, check {c.name}\n{c.detail}\n{figures}"
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
