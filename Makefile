# flashrt_ros: `make demo` and `make test` work on a fresh machine; each builds what is missing.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(abspath $(VENV))/bin/python
PYTHON ?= python3

# DDS must never leave this machine; every run gets its own domain and a throwaway log dir.
export ROS_AUTOMATIC_DISCOVERY_RANGE := LOCALHOST
ifndef ROS_DOMAIN_ID
export ROS_DOMAIN_ID := $(shell echo $$(( 20 + $$$$ % 180 )))
endif
ifndef ROS_LOG_DIR
export ROS_LOG_DIR := $(shell mktemp -d /tmp/flashrt-roslog.XXXXXX)
endif
export PYTHONDONTWRITEBYTECODE := 1

SETUP_STAMP := $(VENV)/.stamp-setup
IFACE_STAMP := $(VENV)/.stamp-interfaces
IFACE_SRC := $(wildcard flashrt_interfaces/*.txt flashrt_interfaces/*.xml flashrt_interfaces/msg/* \
                        flashrt_interfaces/srv/* flashrt_interfaces/action/*)

.PHONY: help setup interfaces demo test lint bench bench-ros gpu-check clean
help:
	@echo "make demo      run the main demo on the CPU default (creates .venv on first use)"
	@echo "make test      run the full test suite"
	@echo "make bench     runtime benchmark -> out/bench_runtime.json"
	@echo "make bench-ros latency through ROS 2 -> out/bench_ros.json"
	@echo "make lint      ruff"
	@echo "make gpu-check GPU tests + benchmarks (needs a CUDA device)"

setup: $(SETUP_STAMP) $(IFACE_STAMP)
interfaces: $(IFACE_STAMP)

$(SETUP_STAMP): requirements.txt requirements-ros.txt setup.py setup.cfg
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt -r requirements-ros.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

# flashrt_interfaces (ament_cmake) built with plain cmake into the venv: no colcon, no /opt/ros.
$(IFACE_STAMP): $(SETUP_STAMP) $(IFACE_SRC) scripts/build_interfaces.sh
	@mkdir -p build
	scripts/build_interfaces.sh $(VENV) build/interfaces
	@touch $@

demo: $(SETUP_STAMP) $(IFACE_STAMP)
	$(VENV)/bin/flashrt-demo

test: $(SETUP_STAMP) $(IFACE_STAMP)
	$(VENV)/bin/ruff check -q flashrt_ros test launch
	$(PY) -m pytest -q test

lint: $(SETUP_STAMP)
	$(VENV)/bin/ruff check flashrt_ros test launch

bench: $(SETUP_STAMP)
	@mkdir -p out
	$(VENV)/bin/flashrt-bench runtime --json out/bench_runtime.json

bench-ros: $(SETUP_STAMP) $(IFACE_STAMP)
	@mkdir -p out
	$(VENV)/bin/flashrt-bench ros --json out/bench_ros.json

# On a GPU machine; works without .venv (the device image has cupy, numpy, pytest, safetensors).
GPU_PY ?= $(if $(wildcard $(VENV)/bin/python),$(PY),python3)
gpu-check:
	@mkdir -p out
	PYTHONPATH=$(CURDIR) $(GPU_PY) -m pytest -q -m gpu test/test_gpu.py
	PYTHONPATH=$(CURDIR) $(GPU_PY) -m flashrt_ros.tools.bench gpu --json out/bench_gpu.json
	PYTHONPATH=$(CURDIR) $(GPU_PY) -m flashrt_ros.tools.bench runtime --backend cuda --json out/bench_runtime_cuda.json

clean:
	rm -rf build out .pytest_cache
