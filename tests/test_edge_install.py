"""A robot installs `tether[edge]`: no torch, Triton, MuJoCo; the edge node imports and `tether edge` runs.

Slow on purpose (`slow`, `install`): it builds the package from a copy of the sources and
pip-installs it with the `edge` extra into an empty venv (about 25 s with pip's wheel cache warm;
a cold cache reaches the package index, as CI does).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what the build needs: pyproject's packages and data-files
SOURCES = ("pyproject.toml", "tether", "protos", "bridge", "inference_server", "trainer", "sim", "launch")
HEAVY = ("torch", "tritonclient", "pytriton", "mujoco", "gymnasium", "newton", "warp", "onnx", "onnxruntime",
         "aiohttp", "safetensors")

PROBE = f"""
import importlib.util, json, sys
import bridge.ros2.node, bridge.ros2.edge, bridge.security
loaded = sorted(m for m in {HEAVY!r} if m in sys.modules)
installed = sorted(m for m in {HEAVY!r} if importlib.util.find_spec(m) is not None)
print(json.dumps({{"file": bridge.ros2.node.__file__, "loaded": loaded, "installed": installed,
                  "dds": importlib.util.find_spec("cyclonedds") is not None}}))
"""


@pytest.mark.slow
@pytest.mark.install
@pytest.mark.timeout(240)
def test_edge_extra_installs_into_an_empty_venv_without_torch(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(path, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    py, tether = venv / "bin" / "python", venv / "bin" / "tether"
    # nothing of the repository or the test's venv on the path: only what the install put there
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{src}[edge]"],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=200)
    assert install.returncode == 0, f"pip install .[edge] failed:\n{install.stdout[-3000:]}\n{install.stderr[-3000:]}"

    probe = subprocess.run([str(py), "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, f"importing the edge node failed:\n{probe.stderr[-3000:]}"
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    assert report["file"].startswith(str(venv)), f"imported {report['file']}, not the venv's install"
    assert report["loaded"] == [], f"importing bridge.ros2.node loaded {report['loaded']}"
    assert report["installed"] == [], f"tether[edge] installed {report['installed']}"
    assert report["dds"], "tether[edge] did not install cyclonedds (the edge's DDS transport without rclpy)"

    helped = subprocess.run([str(tether), "edge", "--help"], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert helped.returncode == 0, f"tether edge --help exited {helped.returncode}:\n{helped.stderr[-3000:]}"
    assert "--gateway" in helped.stdout and "--transport" in helped.stdout
