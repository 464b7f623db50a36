"""The docs a newcomer walks stay true to the tree: links resolve, docs/step.md's hops exist, and every module,
function and file path a page names is in the code.

    links_in(Path("README.md"))      # [(line number, target)] of its relative Markdown links
    hops_in(Path("docs/step.md"))    # [("bridge/gateway/session/session.py", "handle"), ...]
    code_names_in(Path("docs/x.md")) # [(line number, "bridge.gateway.server.Gateway"), (line number, "tether/cli.py")]
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
PACKAGES = ("bridge", "tether", "trainer", "inference_server", "sim", "protos")
DOTTED = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)})(?:\.\w+)+)")
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(PACKAGES)}|tests|benchmarks|launch|deploy|docs)/[\w./-]*\w)")
# names that look like code but are wire names: the proto package, NATS subjects, ONNX metadata keys; a list of
# ROS 2 packages
NOT_CODE = ("tether.v1", "tether.experience", "tether.initializers", "launch/launch_ros/ros2cli")


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


def code_names_in(page: Path) -> list[tuple[int, str]]:
    """Dotted names under the product's packages and repository paths a page mentions (prose and code blocks)."""
    out = []
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for name in [d for d in DOTTED.findall(line) if not d.endswith(".py")] + PATH.findall(line):  # a.launch.py
            name = name.rstrip(".")
            if not name.startswith(NOT_CODE) and not name.endswith((".md", ".yaml", ".json", ".svg", ".png")):
                out.append((n, name))
    return out


def exists(name: str) -> bool:
    """A repository path, a module (dotted or as path.py), or an attribute a module defines or imports."""
    if "/" in name and (ROOT / name).exists():
        return True
    parts = name.replace("/", ".").removesuffix(".py").split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file() or base.is_dir():
            rest = parts[n:]
            return not rest or (module.is_file() and re.search(
                rf"^\s*((async\s+)?def|class)\s+{rest[0]}\b|^\s*{rest[0]}\s*[:=]|^\s*(from .* )?import .*\b{rest[0]}\b",
                module.read_text(), re.M) is not None)
    return False


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


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_module_function_and_path_a_page_names_exists(page: Path):
    missing = [f"{page.name}:{n}: {name}" for n, name in code_names_in(page) if not exists(name)]
    assert not missing, "names that are not in the code:\n" + "\n".join(missing)


def test_the_checks_catch_a_broken_link_and_a_missing_hop(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("See [here](nowhere.md) and `x.py:gone`.\n```\n[not a link](in-code.md)\n```\n")
    (tmp_path / "x.py").write_text("def there():\n    pass\n")
    assert links_in(page) == [(1, "nowhere.md")]
    assert hops_in(page) == [("x.py", "gone")]
    assert not defines(tmp_path / "x.py", "gone") and defines(tmp_path / "x.py", "there")
    page.write_text("`bridge.gateway.server.Gateway`, bridge.gateway.nothing, `tether/nope.py`, tether.v1.Bridge\n")
    assert code_names_in(page) == [(1, "bridge.gateway.server.Gateway"), (1, "bridge.gateway.nothing"),
                                   (1, "tether/nope.py")]
    assert exists("bridge.gateway.server.Gateway") and exists("bridge/gateway/server.py")
    assert not exists("bridge.gateway.nothing") and not exists("tether/nope.py")
