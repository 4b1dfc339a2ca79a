# gpuguard: the README's two commands are `make demo` and `make test`.
# Both run `setup` first, which installs everything a fresh machine lacks.

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := docker.io prometheus prometheus-alertmanager busybox-static docker-compose
# the launch probe (a static libbpf program) and gpusim's libcuda.so.1 stand-in, built by setup
APT_PACKAGES += gcc clang bpftool libbpf-dev libelf-dev zlib1g-dev libcap2-bin
STAMP := $(VENV)/.installed

.PHONY: setup demo stop test lint unit integration rules bench-quick gpu-truth clean

setup: $(STAMP)
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	$(PY) -m gpuguard.exporter.probe.build
	$(PY) -m gpuguard.gpusim.driver

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# setuptools' editable install warns that a folder named like the package may shadow it
	@# on import: here that folder is the package itself (gpuguard/), so the warning is noise.
	PYTHONWARNINGS='ignore:Editable installation:UserWarning' \
	  $(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/gpuguard demo

stop:
	$(VENV)/bin/gpuguard demo --stop

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	@# the dashboards' generator is outside the package; its SDK builders are typed
	$(VENV)/bin/mypy grafana/build.py

# Unit and rules tests: one worker per core (they mostly wait on sockets and child processes;
# more workers than cores made their timed checks flaky). Tests that run a program whole and
# check what it prints (the benchmarks' short forms, pip installs: marked standalone): two at a
# time. Tests on real services: two at a time too, a test file per worker (a module's stack is
# started once), each worker with its own dockerd, directories and ports; they mostly wait on
# their services. `make test` says how long each step takes.
XDIST := -n auto
SERVICES := -n 2 --dist loadfile

unit: setup
	$(PY) -m pytest tests/unit $(XDIST) -q

rules: setup
	$(PY) -m pytest tests/rules -q

integration: setup
	$(PY) -m pytest tests/integration -m standalone -n 2
	$(PY) -m pytest tests/integration -m "not standalone" $(SERVICES) --durations=15

test: lint
	@echo "== unit and rules tests, one worker per core (about 1 minute)"
	$(PY) -m pytest tests/unit tests/rules $(XDIST) -q
	@echo "== benchmarks' short forms and installs, 2 at a time (about 7 minutes)"
	$(PY) -m pytest tests/integration -m standalone -n 2
	@echo "== integration tests on real services, 2 at a time (about 8 minutes)"
	$(PY) -m pytest tests/integration -m "not standalone" $(SERVICES) --durations=15

bench-quick: setup
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b --quick || exit 1; done
	echo "== bench/contention.py --light"; $(PY) bench/contention.py --quick --light

# On a machine with an NVIDIA GPU, torch and nvidia-ml-py (no Docker, no venv needed): the
# real-GPU truth kit, results under bench/results/. Without a GPU it runs on gpusim.
gpu-truth:
	PYTHONPATH=$(CURDIR) python3 bench/gpu_truth.py --out-dir bench/results

# The demo's stack first (its dockerd and processes keep files under .stack/), and nothing
# removed while anything is still mounted under .stack/: rm would go into the mount.
clean:
	if [ -e .stack/stack.json ] && [ -x $(VENV)/bin/gpuguard ]; then $(VENV)/bin/gpuguard demo --stop; fi
	@if grep -qF " $(CURDIR)/.stack/" /proc/self/mounts; then \
	  echo "make clean: something is still mounted under .stack/ (findmnt | grep .stack): unmount it, then run make clean again" >&2; \
	  exit 1; \
	fi
	rm -rf .stack $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
