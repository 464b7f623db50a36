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
	# the console's browser test: Debian's chromium, driven by Playwright (never a downloaded browser)
	@command -v chromium >/dev/null || { apt-get update -qq && apt-get install -y -qq chromium; } || \
	  echo "WARNING: chromium not installed: the console's browser test will skip" >&2
	# ament index + share/tether + the node executable lib/tether/edge in the venv prefix: `ros2 launch
	# tether robot.launch.py`, `ros2 run tether edge` (editable installs skip pyproject's data-files,
	# so link them here)
	mkdir -p $(VENV)/share/ament_index/resource_index/packages $(VENV)/share/tether/launch $(VENV)/share/tether/config \
	  $(VENV)/lib/tether
	ln -sf $(CURDIR)/launch/edge $(VENV)/lib/tether/edge
	touch $(VENV)/share/ament_index/resource_index/packages/tether
	ln -sf $(CURDIR)/launch/robot.launch.py $(CURDIR)/launch/sim.launch.py $(VENV)/share/tether/launch/
	ln -sf $(CURDIR)/launch/config/topic_map.yaml $(CURDIR)/launch/config/gazebo_arm.yaml \
	  $(CURDIR)/launch/config/gz_bridge.yaml $(VENV)/share/tether/config/
	bash tests/peers/setup.sh
	# the fleet's servers for the scale-out tests (issue 16): NATS from Debian; PostgreSQL 15 is Debian's too
	# (issue 23) no fallback: a machine that cannot install them fails here, so the fleet is never left untested;
	# iproute2 makes the network-namespace hosts of the cross-host tests
	@command -v nats-server >/dev/null || { apt-get update -qq && apt-get install -y -qq nats-server; } || \
	  { echo "ERROR: nats-server could not be installed: the fleet tests need it" >&2; exit 1; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq postgresql; } || \
	  { echo "ERROR: PostgreSQL could not be installed: the fleet tests need it" >&2; exit 1; }
	@command -v ip >/dev/null || { apt-get update -qq && apt-get install -y -qq iproute2; } || \
	  { echo "ERROR: iproute2 could not be installed: the cross-host tests need it" >&2; exit 1; }
	# MuJoCo's offscreen cameras (sim.cameras, tether demo --camera): EGL through Mesa, rendered on the CPU
	@/usr/sbin/ldconfig -p | grep -q 'libEGL_mesa\.so' || { apt-get update -qq && \
	  apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri; } || \
	  { echo "ERROR: Mesa's EGL could not be installed: the camera tests need it" >&2; exit 1; }
	# --- ROS 2 (rclpy, launch): their own environment, .venv/ros ----------------------------------
	# The Jazzy rclpy wheels need numpy 2; the bundled Triton (nvidia-pytriton 0.7.0) pins numpy<2.
	# So rclpy, the message packages, `ros2 launch` (wheels in ../shared/ros2-launch: not on the
	# registries) and the edge node's own deps live in a second venv; the edge node and the rclpy
	# robot processes run from it, the tests reach it through subprocesses (and skip, saying why,
	# where it is missing). Best effort: without the wheels the rest of the setup still completes.
	# Tether itself goes in as a robot installs it: the `edge` extra (no torch, Triton, MuJoCo).
	$(PYTHON) -m venv $(VENV)/ros && \
	$(VENV)/ros/bin/python -m pip install -q 'ros-jazzy-rclpy[fastrtps]==7.1.6' ros-jazzy-std-msgs ros-jazzy-sensor-msgs \
	  ros-jazzy-geometry-msgs ros-jazzy-nav-msgs osrf-pycommon lark catkin-pkg argcomplete psutil packaging && \
	$(VENV)/ros/bin/python -m pip install -q -e '.[edge]' || { rm -rf $(VENV)/ros; \
	  echo "WARNING: rclpy (ros-jazzy-* wheels) not installed: the rclpy tests will skip" >&2; }
	@if [ -x $(VENV)/ros/bin/python ] && ls ../shared/ros2-launch/*.whl >/dev/null 2>&1; then \
	  $(VENV)/ros/bin/python -m pip install -q --no-deps ../shared/ros2-launch/*.whl; \
	else echo "WARNING: no ROS 2 launch wheels in ../shared/ros2-launch: the ros2 launch test will skip" >&2; fi
	@if [ -x $(VENV)/ros/bin/python ]; then \
	  mkdir -p $(VENV)/ros/share/ament_index/resource_index/packages $(VENV)/ros/share/tether/launch \
	    $(VENV)/ros/share/tether/config $(VENV)/ros/lib/tether && \
	  ln -sf $(CURDIR)/launch/edge $(VENV)/ros/lib/tether/edge && \
	  touch $(VENV)/ros/share/ament_index/resource_index/packages/tether && \
	  ln -sf $(CURDIR)/launch/robot.launch.py $(CURDIR)/launch/sim.launch.py $(VENV)/ros/share/tether/launch/ && \
	  ln -sf $(CURDIR)/launch/config/topic_map.yaml $(CURDIR)/launch/config/gazebo_arm.yaml \
	    $(CURDIR)/launch/config/gz_bridge.yaml $(VENV)/ros/share/tether/config/; fi
	# --- end ROS 2 ------------------------------------------------------------------------------
	# --- LeRobot (issue 26): its own environment, .venv/lerobot, where LeRobot's loader reads our exports back
	# and its writer makes the datasets our import is tested on. lerobot 0.4.4 pins torch<2.11 and
	# torchvision<0.26, which are not on this disk; its dataset code runs on the pair that is, so it goes in
	# without its pins (--no-deps), with only what its dataset modules import; torchcodec decodes its videos
	# through Debian's FFmpeg. Best effort: without it the LeRobot cross-checks skip and say why.
	@command -v ffmpeg >/dev/null || { apt-get update -qq && apt-get install -y -qq ffmpeg; } || \
	  echo "WARNING: Debian's ffmpeg not installed: LeRobot's video decoding (torchcodec) will fail" >&2
	$(PYTHON) -m venv $(VENV)/lerobot && \
	$(VENV)/lerobot/bin/python -m pip install -q torch==2.14.1 torchvision==0.29.1 torchcodec==0.17.0 && \
	$(VENV)/lerobot/bin/python -m pip install -q --no-deps lerobot==0.4.4 && \
	$(VENV)/lerobot/bin/python -m pip install -q 'datasets>=4,<5' 'huggingface-hub<0.36' 'av>=14,<19' pandas \
	  'pyarrow>=17' fsspec accelerate pillow packaging jsonlines || { rm -rf $(VENV)/lerobot; \
	  echo "WARNING: lerobot not installed in .venv/lerobot: the LeRobot cross-checks will skip" >&2; }
	touch $(STAMP)

demo: setup  # make demo ARGS="--train" for the learning loop
	$(VENV)/bin/tether demo $(ARGS)

test: setup  # 3 workers, a file each at a time; then the `serial` tests alone (docs/testing.md)
	$(PY) -m pytest -n 3 --dist loadfile --no-loadscope-reorder -m "not serial"
	$(PY) -m pytest -m serial tests

lint: setup
	$(VENV)/bin/ruff check .

protos: setup
	$(PY) -m protos.generate

bench: setup
	$(PY) benchmarks/loop_latency.py

clean:
	rm -rf $(VENV) runs
