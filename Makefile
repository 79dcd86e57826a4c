# flashrt_ros: `make demo` and `make test` work on a fresh machine; each builds what is missing.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(abspath $(VENV))/bin/python
PYTHON ?= python3
PIP_Q := -q --disable-pip-version-check
# `make demo DEMO_ARGS="--duration 5"`: a short mission (CI); any flashrt-demo option goes here
# (`--mission trace`: the synthetic-trace mission of the latency benches).
DEMO_ARGS ?=
# processes for every test but the `serial` ones (pytest-xdist). CI has 2 cores; 3, since a worker spends about
# half its time waiting on the nodes it started and on DDS (647 CPU-s in 2 x 719 s, measured on 2 cores)
TEST_WORKERS ?= 3
# Whole test files to a worker: a module-scoped fixture (a node, a bench run, a compiled plan) is made once.
PARALLEL = -n $(TEST_WORKERS) --dist loadfile

# DDS must never leave this machine; every run gets its own domain: 20..99 (tests take 1..19; 0..101 keeps every
# DDS port below the kernel's ephemeral range, ROS docs "About Domain ID").
export ROS_AUTOMATIC_DISCOVERY_RANGE := LOCALHOST
ifndef ROS_DOMAIN_ID
export ROS_DOMAIN_ID := $(shell echo $$(( 20 + $$$$ % 80 )))
endif
export PYTHONDONTWRITEBYTECODE := 1
# The compiled CPU step's cache is the one the installed tools use (NUMBA_CACHE_DIR, else
# ~/.cache/flashrt_ros/numba; numba names its files by Python version), filled by `make setup`: `make demo`,
# `make test` and a tool run afterwards start without compiling.
# A throwaway ROS log dir, made only by the recipes that start ROS processes (prefix their command
# with this), so `make help` and the build steps leave nothing behind in $TMPDIR.
WITH_ROS_LOG := export ROS_LOG_DIR="$${ROS_LOG_DIR:-$$(mktemp -d -t flashrt-roslog.XXXXXX)}";
# The same for a test run, removed when the recipe line ends (the tests keep their nodes' logs under pytest's
# tmp_path); a ROS_LOG_DIR of the caller's is left alone.
WITH_TEMP_ROS_LOG := if [ -z "$${ROS_LOG_DIR:-}" ]; then ROS_LOG_DIR=$$(mktemp -d -t flashrt-roslog.XXXXXX); \
  trap 'rm -rf "$$ROS_LOG_DIR"' EXIT; fi; export ROS_LOG_DIR;

# setup.cfg sends console scripts to lib/flashrt_ros, where `ros2 run` looks in a colcon install;
# in a venv they belong in bin/, so every venv install overrides that with this extra config.
VENV_SCRIPTS := DIST_EXTRA_CONFIG=$(CURDIR)/scripts/venv_scripts.cfg
# $(call venv_install,VENV): the package itself, editable, scripts in VENV/bin.
venv_install = $(VENV_SCRIPTS) $(1)/bin/python -m pip install $(PIP_Q) --no-deps --no-build-isolation -e .

SETUP_STAMP := $(VENV)/.stamp-setup
IFACE_STAMP := $(VENV)/.stamp-interfaces
IFACE_SRC := $(wildcard flashrt_interfaces/*.txt flashrt_interfaces/*.xml flashrt_interfaces/msg/* \
                        flashrt_interfaces/srv/* flashrt_interfaces/action/*)
PKG_SRC := setup.py setup.cfg scripts/venv_scripts.cfg

.PHONY: help setup interfaces demo test test-compat test-jazzy test-train test-install lint bench bench-ros bench-persist bench-stream plots reproduce gpu-check mutate train-policy clean
help:
	@echo "make demo        the arm mission: simulated arm, trained policy, fault corrections (creates .venv on"
	@echo "                 first use); DEMO_ARGS=\"--duration 5\" for a short one, \"--mission trace\" for the old one"
	@echo "make test        run the full test suite"
	@echo "make test-compat the tests that need no ROS wheels on Python 3.10 + numpy 1.x (Humble's stack)"
	@echo "make test-jazzy  the ROS, demo and replay tests against ROS 2 Jazzy wheels (.venv-jazzy)"
	@echo "make test-train  the PyTorch reference module and flashrt-train (.venv-train, PyTorch CPU)"
	@echo "make test-install the README's Humble pip line resolved by pip on Python 3.10 + numpy 1.21 (needs the network)"
	@echo "make bench       runtime benchmark -> out/bench_runtime.json"
	@echo "make bench-ros   latency through ROS 2 -> out/bench_ros.json"
	@echo "make bench-persist  capsule log: step overhead, MiB/s, resume, kill -9 -> out/bench_persist.json"
	@echo "make bench-stream   capsule stream: overhead, replica lag, failover, --from seek -> out/bench_stream.json"
	@echo "make plots       the README's figures from short real runs -> out/plots/img/ (PLOTS_DIR=docs/img replaces the README's)"
	@echo "make reproduce   rerun every benchmark behind a README number: README value, fresh value, ratio"
	@echo "                 (out/reproduce_<table>.json; REPRODUCE_ARGS=\"--tables history\" for a subset)"
	@echo "make lint        ruff + the layer order (import-linter, .importlinter)"
	@echo "make gpu-check   GPU tests + benchmarks (needs a CUDA device)"
	@echo "make train-policy record the sim expert's bags, train the Pusher policy (.venv-train), write"
	@echo "                 $(SIM_POLICY) and print its validation loss (~40 min)"
	@echo "make mutate      break the code on purpose, one named mutation at a time; each must be caught"
	@echo "                 (CHANGED=1: only those of the files changed since main; MODULES=path; MUTATIONS=a,b)"

setup: $(SETUP_STAMP) $(IFACE_STAMP)
	@# the compiled CPU step into its cache (1-3 min the first time, a second after)
	$(PY) -c 'from flashrt_ros.runtime.engine.backend import warm_cpu_step; warm_cpu_step("cpu")'
interfaces: $(IFACE_STAMP)

$(SETUP_STAMP): requirements.txt requirements-ros.txt constraints.txt $(PKG_SRC)
	@# a venv whose creation was interrupted has a python but no pip: made again, not used
	@$(PY) -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear $(VENV)
	$(PY) -m pip install $(PIP_Q) -r requirements.txt -r requirements-ros.txt -c constraints.txt
	$(call venv_install,$(VENV))
	@touch $@

# flashrt_interfaces (ament_cmake) built with plain cmake into the venv: no colcon, no /opt/ros.
$(IFACE_STAMP): $(SETUP_STAMP) $(IFACE_SRC) scripts/build_interfaces.sh
	@mkdir -p build
	scripts/build_interfaces.sh $(VENV) build/interfaces
	@touch $@

demo: $(SETUP_STAMP) $(IFACE_STAMP)
	$(WITH_ROS_LOG) $(VENV)/bin/flashrt-demo $(DEMO_ARGS)

test: $(SETUP_STAMP) $(IFACE_STAMP)
	$(VENV)/bin/ruff check -q flashrt_ros test launch scripts
	$(VENV)/bin/lint-imports --no-cache
	@# the slowest tests named at the end: the suite's time is watched (at most 5 minutes is the aim).
	@# Every test on TEST_WORKERS cores, those that start ROS nodes too (each on a domain of its own); then the
	@# `serial` ones one at a time, since they time DDS round trips or a node's 100 Hz loop, which a test beside
	@# them would disturb.
	$(WITH_TEMP_ROS_LOG) $(PY) -m pytest -q $(PARALLEL) -m "not serial and not train and not network" --durations=10 --durations-min=5 test
	$(WITH_TEMP_ROS_LOG) $(PY) -m pytest -q -m "serial and not train and not network" --durations=10 --durations-min=5 test

# ---- the robot's stack: Python 3.10 (JetPack 6 / Humble) with numpy 1.x, no ROS wheels -------------
COMPAT_VENV := .venv-compat
COMPAT_STAMP := $(COMPAT_VENV)/.stamp-setup
# The pure-Python bag libraries (not ROS wheels), so offline replay is tested on Python 3.10 too.
BAG_LIBS = $(shell grep -oE '^(rosbags|mcap|mcap-ros2-support)(==[^ ]*)?' requirements-ros.txt)

$(COMPAT_STAMP): requirements.txt requirements-ros.txt constraints-compat.txt scripts/find_python.sh $(PKG_SRC)
	@$(COMPAT_VENV)/bin/python -m pip --version >/dev/null 2>&1 || \
	  { py=$$(scripts/find_python.sh 3.10) && $$py -m venv --clear $(COMPAT_VENV); }
	$(COMPAT_VENV)/bin/python -m pip install $(PIP_Q) -r requirements.txt $(BAG_LIBS) -c constraints-compat.txt
	$(call venv_install,$(COMPAT_VENV))
	@touch $@

test-compat: $(COMPAT_STAMP)
	$(COMPAT_VENV)/bin/python -c 'import sys, numpy; print("test-compat: Python", sys.version.split()[0], \
	  "numpy", numpy.__version__); sys.exit(sys.version_info[:2] != (3, 10) or numpy.__version__ >= "2")'
	@# Python 3.10's compiled CPU step into the shared cache first: a test's tool subprocess would compile it cold
	$(COMPAT_VENV)/bin/python -c 'from flashrt_ros.runtime.engine.backend import warm_cpu_step; warm_cpu_step("cpu")'
	$(COMPAT_VENV)/bin/python -m pytest -q $(PARALLEL) -m "not ros and not train and not network" test

# ---- ROS 2 Jazzy wheels in a second venv --------------------------------------------------------------
JAZZY_VENV := .venv-jazzy
JAZZY_STAMP := $(JAZZY_VENV)/.stamp-setup
JAZZY_IFACE_STAMP := $(JAZZY_VENV)/.stamp-interfaces
# every ROS test (-m ros), then the ROS-free tests of the files that run ROS code offline (replay, demos)
JAZZY_ROS_FREE := test/test_faults.py test/test_demos.py test/test_replay*.py test/test_dead_participants.py

$(JAZZY_STAMP): requirements.txt requirements-jazzy.txt constraints.txt $(PKG_SRC)
	@$(JAZZY_VENV)/bin/python -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear $(JAZZY_VENV)
	$(JAZZY_VENV)/bin/python -m pip install $(PIP_Q) -r requirements.txt -r requirements-jazzy.txt -c constraints.txt
	$(call venv_install,$(JAZZY_VENV))
	@touch $@

$(JAZZY_IFACE_STAMP): $(JAZZY_STAMP) $(IFACE_SRC) scripts/build_interfaces.sh
	@mkdir -p build
	scripts/build_interfaces.sh $(JAZZY_VENV) build/interfaces-jazzy
	@touch $@

test-jazzy: $(JAZZY_STAMP) $(JAZZY_IFACE_STAMP)
	$(JAZZY_VENV)/bin/python -c 'import rclpy, importlib.metadata as m; print("test-jazzy: rclpy", m.version("ros-rclpy"))'
	@# the compiled CPU step into the shared cache first: on a fresh clone the first node would compile it
	@# (~30 s) inside a test's 30 s wait for the node (make test compiles it in its earlier, ROS-free tests)
	$(JAZZY_VENV)/bin/python -c 'from flashrt_ros.runtime.engine.backend import warm_cpu_step; warm_cpu_step("cpu")'
	@# as make test: every ROS test on TEST_WORKERS cores but the `serial` ones, which run alone after them
	$(WITH_TEMP_ROS_LOG) $(JAZZY_VENV)/bin/python -m pytest -q $(PARALLEL) -m "ros and not serial" test
	$(WITH_TEMP_ROS_LOG) $(JAZZY_VENV)/bin/python -m pytest -q -m "ros and serial" test
	$(WITH_TEMP_ROS_LOG) $(JAZZY_VENV)/bin/python -m pytest -q -m "not ros" $(JAZZY_ROS_FREE)

# ---- PyTorch (optional: pip install .[train]) in its own venv, Python 3.11 -----------------------------
TRAIN_VENV := .venv-train
TRAIN_STAMP := $(TRAIN_VENV)/.stamp-setup

$(TRAIN_STAMP): requirements.txt requirements-train.txt constraints.txt $(PKG_SRC)
	@$(TRAIN_VENV)/bin/python -m pip --version >/dev/null 2>&1 || \
	  { py=$$(scripts/find_python.sh 3.11) && $$py -m venv --clear $(TRAIN_VENV); }
	$(TRAIN_VENV)/bin/python -m pip install $(PIP_Q) -r requirements.txt -r requirements-train.txt -c constraints.txt
	$(call venv_install,$(TRAIN_VENV))
	@touch $@

# the README's pip line for Humble, resolved by pip against PyPI: needs the network, so not in `make test`
test-install: $(SETUP_STAMP)
	$(PY) -m pytest -q -s -m network test/test_readme_install.py

test-train: $(SETUP_STAMP) $(TRAIN_STAMP)
	$(TRAIN_VENV)/bin/python -c 'import torch; print("test-train: torch", torch.__version__)'
	$(TRAIN_VENV)/bin/python -m pytest -q $(PARALLEL) -m train --durations=10 test

# The shipped Pusher policy (docs/sim.md), recorded offline and trained in .venv-train: the expert's rollouts and
# perturbed ones (the arm off the expert's path, the expert's targets kept: plain cloning never succeeded, 0/30),
# and faulty ones (the observations carry sim/faults.py's seeded faults, the expert answers the true state: without
# them a sensor fault took the task from 0.88 to 0.72 over 50 seeds, with them 0.84 to 0.84).
# A small GRU policy answering each observation alone (chunk_len 1: the action is the trajectory's first point).
SIM_POLICY := config/policies/pusher.safetensors
SIM_POLICY_RUN := out/train-policy
SIM_POLICY_TRAIN := --obs-topic /observation --action-topic /action_trajectory --d-model 96 --n-layers 2 \
  --n-heads 4 --kv-window 64 --mixer gru --chunk-len 1 --window 128 --batch 16 --steps 8000 --eval-every 500 \
  --lr 2e-3 --val-bags 0.1 --threads 1
# bags of one corpus need distinct names: $(call sim_bags,NAME,EPISODES,FLAGS) records NAME_000 ... into the corpus
sim_bags = $(VENV)/bin/flashrt-sim --expert --record $(SIM_POLICY_RUN)/$(1) --episodes $(2) $(3) && \
  for b in $(SIM_POLICY_RUN)/$(1)/episode_*; do mv $$b $(SIM_POLICY_RUN)/bags/$(1)_$${b\#\#*_}; done
train-policy: $(SETUP_STAMP) $(TRAIN_STAMP)
	rm -rf $(SIM_POLICY_RUN) && mkdir -p $(SIM_POLICY_RUN)/bags
	$(call sim_bags,expert,150,--seed 0)
	$(call sim_bags,perturbed,150,--seed 1 --perturb 0.05)
	$(call sim_bags,faulty,150,--seed 2 --faults)
	$(TRAIN_VENV)/bin/flashrt-train $(SIM_POLICY_RUN)/bags $(SIM_POLICY_TRAIN) --out $(SIM_POLICY_RUN)/run
	$(PY) -m flashrt_ros.sim.ship $(SIM_POLICY_RUN)/run $(SIM_POLICY)

# ruff, then the layer order (.importlinter): a wrong-way import fails here.
lint: $(SETUP_STAMP)
	$(VENV)/bin/ruff check flashrt_ros test launch scripts
	$(VENV)/bin/lint-imports --no-cache

# Not part of `make test` (it reruns test files once per mutation; the whole list takes hours): test/mutations.py.
# MUTATIONS=a,b by name; MODULES="file_or_folder ..." of those files; CHANGED=1 (or CHANGED=<base>) of the files a
# change touched since its merge-base with main (or <base>). Selections add up; none: every mutation.
mutate: $(SETUP_STAMP) $(IFACE_STAMP)
	$(WITH_ROS_LOG) $(PY) scripts/mutate.py $(if $(CHANGED),--changed=$(if $(filter 1,$(CHANGED)),main,$(CHANGED))) \
	  $(addprefix --module ,$(MODULES)) $(MUTATIONS)

bench: $(SETUP_STAMP)
	@mkdir -p out
	$(VENV)/bin/flashrt-bench runtime --json out/bench_runtime.json

bench-ros: $(SETUP_STAMP) $(IFACE_STAMP)
	@mkdir -p out
	$(WITH_ROS_LOG) $(VENV)/bin/flashrt-bench ros --json out/bench_ros.json

bench-persist: $(SETUP_STAMP)
	@mkdir -p out
	$(VENV)/bin/flashrt-bench persist --json out/bench_persist.json

bench-stream: $(SETUP_STAMP) $(IFACE_STAMP)
	@mkdir -p out
	$(WITH_ROS_LOG) $(VENV)/bin/flashrt-bench stream --json out/bench_stream.json

# Every --plot figure the README shows, from short real runs of the tools (JSON of each in out/plots/).
# Into out/ (untracked): the tracked docs/img/ is rewritten only when asked, `make plots PLOTS_DIR=docs/img`.
PLOTS_DIR ?= out/plots/img
plots: $(SETUP_STAMP) $(IFACE_STAMP)
	$(WITH_ROS_LOG) $(PY) scripts/make_plots.py $(PLOTS_DIR)

# Every README Results number (docs/readme_numbers.json) rerun and compared; GPU tables skipped without a device.
REPRODUCE_ARGS ?=
reproduce: $(SETUP_STAMP) $(IFACE_STAMP)
	$(WITH_ROS_LOG) $(PY) scripts/reproduce.py $(REPRODUCE_ARGS)

# On a GPU machine; works without .venv (the device image has cupy, numpy, numba, pytest, safetensors).
GPU_PY ?= $(if $(wildcard $(VENV)/bin/python),$(PY),python3)
gpu-check:
	GPU_PY=$(GPU_PY) scripts/gpu_check.sh

clean:
	rm -rf build out .pytest_cache
