"""Dependencies point down, with no cycles. The rules are docs/architecture.md's "Layers" block: each line a layer,
top first; a module imports its own unit and the layers below it, never a layer above or a peer on its own line.
Every import statement counts (module level, inside a function, under TYPE_CHECKING), and every product module
must belong to a layer, so a new package is placed before it can be imported."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("bridge", "tether", "trainer", "inference_server", "sim", "protos", "launch", "benchmarks")


def layers(text: str) -> list[list[str]]:
    """The units of each layer, top first, from the ```text block under "## Layers" (`units  # comment`)."""
    section = text.split("\n## Layers", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, re.S)[1]
    return [line.split("#")[0].split() for line in block.splitlines() if line.split("#")[0].strip()]


LAYERS = layers((ROOT / "docs/architecture.md").read_text())
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def unit_of(module: str) -> str | None:
    """The longest unit that is `module` or a package above it."""
    parts = module.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in RANK), None)


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def modules() -> dict[str, Path]:
    return {module_name(p): p for top in PRODUCT for p in sorted((ROOT / top).rglob("*.py"))
            if "__pycache__" not in p.parts and "results" not in p.parts}


MODULES = modules()


def imports_of(path: Path) -> set[str]:
    """Every product module `path` imports, anywhere in it (relative imports resolved), as it exists on disk."""
    names, own = set(), module_name(path).split(".")
    package = own if path.name == "__init__.py" else own[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            found = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in found:
            while name and name not in MODULES:  # `from pkg import name`: the module pkg.name, else pkg
                name = name.rpartition(".")[0]
            if name and name.split(".")[0] in PRODUCT:
                names.add(name)
    return names - {module_name(path)}


GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def test_the_rules_are_read_from_the_docs():
    assert len(LAYERS) >= 8 and "bridge.common" in LAYERS[-1] and "benchmarks" in LAYERS[0], LAYERS
    assert len(RANK) == sum(map(len, LAYERS)), "a unit is on two lines of the Layers block"


def test_every_module_that_imports_or_is_imported_has_a_layer():
    used = {name for name, targets in GRAPH.items() if targets} | set().union(*GRAPH.values())
    missing = sorted(name for name in used if unit_of(name) is None)
    assert not missing, "modules in no layer of docs/architecture.md (add their package):\n" + "\n".join(missing)


def test_dependencies_point_down():
    wrong = []
    for name, targets in GRAPH.items():
        own = unit_of(name)
        for target in targets:
            unit = unit_of(target)
            if own and unit and unit != own and RANK[unit] <= RANK[own]:
                where = "a peer on its line" if RANK[unit] == RANK[own] else "a layer above"
                wrong.append(f"{name} ({own}) imports {target} ({unit}): {where}")
    assert not wrong, "imports against docs/architecture.md's layers:\n" + "\n".join(sorted(wrong))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]; counter[0] += 1; stack.append(root); on.add(root)  # noqa: E702
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]; counter[0] += 1  # noqa: E702
                    stack.append(child); on.add(child)  # noqa: E702
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop(); on.discard(top); component.append(top)  # noqa: E702
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_between_modules():
    found = cycles(GRAPH)
    assert not found, "import cycles (imports inside functions count):\n" + "\n".join(map(str, found))


def test_the_checks_see_a_lazy_import_an_upward_import_and_a_cycle(tmp_path):
    module = ROOT / "bridge/common/_layering_probe.py"
    module.write_text("def f():\n    from bridge.gateway import errors\n    return errors\n")
    try:
        assert "bridge.gateway.errors" in imports_of(module)
        assert RANK[unit_of("bridge.gateway.errors")] < RANK[unit_of("bridge.common._layering_probe")]
    finally:
        module.unlink()
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layers("x\n## Layers\n```text\ntop  # t\n\nmid other\nbottom\n```\n") == [["top"], ["mid", "other"],
                                                                                    ["bottom"]]


@pytest.mark.parametrize("package", ["bridge.common", "bridge.registry", "bridge.security", "bridge.experience",
                                     "bridge.rewards", "bridge.gate", "bridge.client", "inference_server", "trainer",
                                     "sim"])
def test_importing_a_library_loads_no_gateway_or_console(package):
    code = (f"import importlib, json, sys\nimportlib.import_module({package!r})\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('bridge.gateway', 'bridge.console')))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
