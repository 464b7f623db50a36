"""The docs a newcomer walks stay true to the tree: links resolve, and docs/step.md's hops exist.

    links_in(Path("README.md"))      # [(line number, target)] of its relative Markdown links
    hops_in(Path("docs/step.md"))    # [("bridge/gateway/session/session.py", "handle"), ...]
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HOP = re.compile(r"`([\w./-]+\.py):(\w+)`")
FENCE = re.compile(r"^(```|~~~)")


def links_in(page: Path) -> list[tuple[int, str]]:
    """Relative link targets outside code blocks (http(s), mailto and in-page anchors left out)."""
    out, fenced = [], False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"^[a-z]+:", target) and not target.startswith("#"):
                out.append((n, target))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.

    >>> slug("Hot swap: `python benchmarks/hot_swap.py`")
    'hot-swap-python-benchmarkshot_swappy'
    """
    text = heading.strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    fenced, out = False, set()
    for line in page.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def hops_in(page: Path) -> list[tuple[str, str]]:
    return HOP.findall(page.read_text())


def defines(path: Path, name: str) -> bool:
    return re.search(rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b", path.read_text(), re.M) is not None


def test_readme_is_short_and_keeps_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 220, f"README.md has {len(text.splitlines())} lines: move detail into docs/"
    for line in ("make demo   # installs everything into .venv, then runs the closed loop on embedded defaults",
                 "make test   # installs everything, then runs the whole test suite"):
        assert line in text, f"README.md lost the line {line!r}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path):
    bad = []
    for n, target in links_in(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve()
        if not resolved.exists():
            bad.append(f"{page.name}:{n}: {target} (no file {resolved.relative_to(ROOT)})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            bad.append(f"{page.name}:{n}: {target} (no heading #{anchor} in {resolved.name})")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_every_hop_of_the_step_page_exists():
    hops = hops_in(ROOT / "docs" / "step.md")
    assert len(hops) >= 20, f"docs/step.md names only {len(hops)} file.py:function hops"
    missing = [f"{file}:{name}" + ("" if (ROOT / file).is_file() else " (no such file)")
               for file, name in hops if not ((ROOT / file).is_file() and defines(ROOT / file, name))]
    assert not missing, "docs/step.md names hops that are not in the code:\n" + "\n".join(missing)


def test_the_checks_catch_a_broken_link_and_a_missing_hop(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("See [here](nowhere.md) and `x.py:gone`.\n```\n[not a link](in-code.md)\n```\n")
    (tmp_path / "x.py").write_text("def there():\n    pass\n")
    assert links_in(page) == [(1, "nowhere.md")]
    assert hops_in(page) == [("x.py", "gone")]
    assert not defines(tmp_path / "x.py", "gone") and defines(tmp_path / "x.py", "there")
