# Everything a fresh Debian machine with only python3 needs: `make demo`, `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test lint protos bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3-venv missing: installing it with apt-get"; \
	  apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip
	# torch first: the CPU build on disk, before anything pulls a CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
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
