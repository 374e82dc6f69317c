# sparkfleet developer entry points. `make lab` and `make test` do all their own set-up.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
LOCK := requirements/lock.txt
STAMP := $(VENV)/.installed-$(shell sha256sum $(LOCK) python/pyproject.toml lab/pyproject.toml 2>/dev/null | sha256sum | cut -c1-12)
TOPOLOGY ?= tp3
export PATH := $(abspath $(BIN)):$(PATH)
export ANSIBLE_CONFIG := $(abspath ansible.cfg)

.PHONY: help host venv lab lab-down lab-status lint unit checks images labctl molecule test test-vm test-vm-arm64 bench lock clean

help:
	@echo "make lab        a simulated TP3 cluster, provisioned end to end (TOPOLOGY=tp2 for TP2)"
	@echo "make test       lint + unit tests + molecule scenarios (the CI command)"
	@echo "make test-vm    the VM lab's scenario alone (qemu guests: real kernel, GRUB, reboots; make test runs it too)"
	@echo "make test-vm-arm64  the arm64 VM's scenario (one UEFI guest: the 16K kernel's install, trial boot, pin; opt-in)"
	@echo "make bench      benchmarks, each printing a ratio measured side by side"
	@echo "make lab-down   remove the lab's containers, networks and keys"

# System packages and a running Docker engine (the lab needs both).
host:
	@scripts/ensure-host.sh

$(STAMP): $(LOCK) python/pyproject.toml lab/pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r $(LOCK)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e python/ -e lab/
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

lab: host venv
	$(BIN)/sparkfleet lab up --topology $(TOPOLOGY)

lab-down: venv
	$(BIN)/sparkfleet lab down --topology $(TOPOLOGY)

lab-status: venv
	$(BIN)/sparkfleet lab status --topology $(TOPOLOGY)

lint: venv
	$(BIN)/yamllint -s .
	$(BIN)/ruff check python lab tests plugins molecule bench scripts
	$(BIN)/ruff format --check python lab tests plugins molecule bench scripts
	$(BIN)/ansible-lint
	$(PY) scripts/check-docs.py

unit: venv
	$(BIN)/pytest -q -n 4 --dist loadgroup tests/unit

# lint then unit tests, one after the other: CPU work; `make test` runs them beside the lab side
checks: venv
	$(MAKE) --no-print-directory -j1 lint unit

# The lab's node and engine-base images (debootstrap + docker import), if missing
images: host venv
	$(BIN)/sparkfleet lab images

molecule: host venv
	scripts/ensure-vm-host.sh
	scripts/run-molecule.sh

labctl: host venv
	$(BIN)/pytest -q tests/labctl

# images, then labctl and molecule, with `checks` (lint, unit) beside them: scripts/test-all.sh
test: host venv
	scripts/test-all.sh

# The VM lab's scenario alone (molecule/vm: qemu guests with real kernels, GRUB and reboots; `test` runs it too,
# first in the third lane, before the walk). Installs qemu and the disk-build tools if missing.
test-vm: venv
	scripts/ensure-vm-host.sh
	MOLECULE_SCENARIOS=vm MOLECULE_PARALLEL=0 scripts/run-molecule.sh

# The arm64 VM's scenario (molecule/vm_arm64: one qemu-system-aarch64 guest, TCG, UEFI; host_tuning's 64k profile at
# 16K pages with Debian's arm64-16k kernel, README "The 64K kernel"). Opt-in: neither `test` nor CI runs it (emulated
# arm64 is slow). Installs qemu-system-aarch64, AAVMF and qemu-user-static (binfmt_misc) if missing.
test-vm-arm64: venv
	scripts/ensure-vm-host.sh --arm64
	MOLECULE_SCENARIOS=vm_arm64 MOLECULE_PARALLEL=0 scripts/run-molecule.sh

bench: host venv
	$(PY) -m bench

# Re-resolve the lock from requirements/dev.txt (needs PyPI).
lock:
	rm -rf .cache/lockvenv && python3 -m venv .cache/lockvenv
	.cache/lockvenv/bin/pip install -q -r requirements/dev.txt
	.cache/lockvenv/bin/pip freeze --exclude-editable | sort -f > $(LOCK)

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
