# Everything a fresh Debian machine with only python3 needs: `make demo`, `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint protos bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3-venv missing: installing it with apt-get"; rm -rf $(VENV); \
	  apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }
	# Triton's python backend stub embeds libpython: Debian ships it apart from the interpreter
	@$(PY) -c 'import os, sysconfig as s; v = s.get_config_var; raise SystemExit(not os.path.exists(os.path.join(v("LIBDIR") or "", v("INSTSONAME") or "-")))' || { \
	  echo "shared libpython missing: installing it with apt-get"; \
	  apt-get update -qq && apt-get install -y -qq "lib$$($(PY) -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')"; }
	$(PY) -m pip install -q --upgrade pip
	# torch first: the CPU build on disk, before anything pulls a CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# ament index + share/tether in the venv prefix: `ros2 launch tether robot.launch.py` (editable
	# installs skip pyproject's data-files, so link them here)
	mkdir -p $(VENV)/share/ament_index/resource_index/packages $(VENV)/share/tether/launch $(VENV)/share/tether/config
	touch $(VENV)/share/ament_index/resource_index/packages/tether
	ln -sf $(CURDIR)/launch/robot.launch.py $(CURDIR)/launch/sim.launch.py $(VENV)/share/tether/launch/
	ln -sf $(CURDIR)/launch/config/topic_map.yaml $(VENV)/share/tether/config/
	bash tests/peers/setup.sh
	touch $(STAMP)

demo: setup
	$(VENV)/bin/tether demo

test: setup
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check .

protos: setup
	$(PY) -m protos.generate

bench: setup
	$(PY) benchmarks/loop_latency.py

clean:
	rm -rf $(VENV) runs
