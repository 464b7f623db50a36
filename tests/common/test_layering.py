"""Dependencies point down (DESIGN.md): errors and small helpers at the bottom, libraries never import
the gateway or the console. Read from the source (every import statement, module level or inside a
function), and checked once more by importing the libraries in a fresh interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = ("bridge/common", "bridge/registry", "bridge/security", "bridge/experience", "bridge/rewards",
             "bridge/gate")
ABOVE = ("bridge.gateway", "bridge.console")


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, absolute names (relative imports resolved against its package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = path.relative_to(ROOT).with_suffix("").parts[:-1]
                parts = list(package[: len(package) - node.level + 1])
                base = ".".join([*parts, base] if base else parts)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("folder", LIBRARIES)
def test_libraries_never_import_the_gateway_or_the_console(folder):
    assert _modules(folder), f"{folder} has no modules: the layering test reads the wrong tree"
    upward = {f"{p.relative_to(ROOT)}: {name}" for p in _modules(folder) for name in imports_of(p)
              if any(name == a or name.startswith(a + ".") for a in ABOVE)}
    assert not upward, "imports that run upward:\n" + "\n".join(sorted(upward))


def test_common_imports_nothing_else_of_bridge():
    outside = {f"{p.relative_to(ROOT)}: {name}" for p in _modules("bridge/common") for name in imports_of(p)
               if name.startswith("bridge.") and not name.startswith("bridge.common")}
    assert not outside, "bridge.common must be the bottom layer:\n" + "\n".join(sorted(outside))


def test_the_check_sees_a_lazy_import_inside_a_function(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text("def f():\n    from bridge.gateway import errors\n    return errors\n")
    assert {"bridge.gateway", "bridge.gateway.errors"} <= imports_of(module)


def test_importing_the_libraries_loads_no_gateway_or_console():
    packages = [folder.replace("/", ".") for folder in LIBRARIES]
    code = ("import importlib, json, sys\n"
            f"for name in {packages!r}:\n    importlib.import_module(name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('bridge.gateway', 'bridge.console')))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


WIRING = {"server.py", "config.py", "cli.py", "views.py"}  # the composition root and its typing-only Protocols


def test_the_gateway_step_path_never_imports_the_console():
    """The console is a one-way adapter over the gateway: only the wiring (which builds the console) names it."""
    upward = {f"{p.relative_to(ROOT)}: {name}" for p in _modules("bridge/gateway") if p.name not in WIRING
              for name in imports_of(p) if name == "bridge.console" or name.startswith("bridge.console.")}
    assert not upward, "gateway modules that import the console:\n" + "\n".join(sorted(upward))


def test_no_lazy_imports_of_bridge_packages_in_the_gateway_or_the_console():
    """An import inside a function to dodge a cycle between the gateway and the console is a workaround: the
    layers need none (the gateway's wiring imports the console at the top, the console imports gateway modules)."""
    lazy = set()
    other = {"bridge/gateway": ("bridge.console",), "bridge/console": ("bridge.gateway",),
             "bridge/common": ("bridge.gateway", "bridge.console")}
    for folder, names in other.items():
        for path in _modules(folder):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    for inner in ast.walk(node):
                        if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith(names):
                            lazy.add(f"{path.relative_to(ROOT)}:{inner.lineno}: {inner.module}")
    assert not lazy, "lazy imports of the gateway/console:\n" + "\n".join(sorted(lazy))
