# Fresh machine:  make demo   (set everything up, then run `datacache demo`)
#                 make test   (set everything up, then run the tests)
#
# `system` installs the Debian packages the tests use for real (FUSE's fusermount3, nginx as an
# HTTP source, OpenSSH for SFTP, rclone and s3fs-fuse as peers, fio for the benchmarks' smoke
# test, gcc for the FUSE loop's C part) only when one is missing; it needs root (CI runs as
# root) or password-less sudo. `venv` makes .venv and installs this project with its dev extras,
# again only when pyproject.toml changed since the last install. `make demo` needs less (fuse3,
# gcc and the demo extras: a few minutes on a fresh machine); a later `make test` adds the rest.

SHELL       := /bin/bash
PYTHON      ?= python3
VENV        := .venv
STAMP       := $(VENV)/.installed
DEMO_STAMP  := $(VENV)/.installed-demo
DEB_PACKAGES := fuse3 gcc libc6-dev attr nginx openssh-server sshfs rclone s3fs fio btrfs-progs
# gcc, libc6-dev: pip builds the FUSE request loop's C fast path (datacache_fuse/kernel/_pump.c)
DEMO_DEB_PACKAGES := fuse3 gcc libc6-dev
# Each long step says what it does before it starts (a silent install looks hung).
say          = @echo "==> [$$(date +%H:%M:%S)] $(1)"

.PHONY: all system system-demo venv demo test clean

all: test

define apt_install
	$(call say,make system: checking the Debian packages $(2) uses ($(1)))
	@set -euo pipefail; \
	if ! command -v dpkg >/dev/null; then \
	  echo "make system: not a Debian-based system; install by hand: $(1)" >&2; exit 0; fi; \
	missing=""; \
	for p in $(1); do dpkg -s "$$p" >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if ! command -v $(PYTHON) >/dev/null; then missing="$$missing python3 python3-venv"; \
	else $(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; fi; \
	[ -z "$$missing" ] && exit 0; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo"; \
	else echo "make system: missing Debian packages:$$missing (run 'sudo make $@')" >&2; exit 0; fi; \
	echo "==> [$$(date +%H:%M:%S)] make system: installing$$missing with apt-get (its progress follows)"; \
	policy=""; \
	if [ ! -e /usr/sbin/policy-rc.d ]; then \
	  policy=/usr/sbin/policy-rc.d; \
	  printf '#!/bin/sh\nexit 101\n' | $$sudo tee $$policy >/dev/null; $$sudo chmod 755 $$policy; \
	  trap '$$sudo rm -f $$policy' EXIT; \
	fi; \
	$$sudo apt-get update; \
	$$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing
endef

system:
	$(call apt_install,$(DEB_PACKAGES),the test suite)

system-demo:
	$(call apt_install,$(DEMO_DEB_PACKAGES),the demo)

# Installed packages must not start nginx/sshd on their default ports: the tests start their own
# on loopback. A policy-rc.d that says "no" (as Docker images ship) is put in place for the install.

venv: system $(STAMP)

# torch==2.13.0 is the CPU build this machine type carries on disk (for the DataLoader test); an
# unpinned torch would pull a multi-GB CUDA build. One small C file is compiled (a second): the
# FUSE request loop's fast path, fuse/datacache_fuse/kernel/_pump.c; the rest of the mount is
# Python (fuse/datacache_fuse/kernel speaks the kernel's protocol on /dev/fuse; fuse3 brings
# fusermount3 for mounts by users other than root).
$(STAMP): pyproject.toml | system
	$(call say,make venv: creating $(VENV) with $(PYTHON))
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(call say,make venv: installing datacache with its dev extras and torch 2.13.0 (CPU) with pip: \
	  each package is named as it is fetched; then pip installs them all (about 100) without a word \
	  for 1-2 minutes)
	$(VENV)/bin/python -m pip install -e '.[dev]' 'torch==2.13.0'
	touch $@ $(DEMO_STAMP)
	$(call say,make venv: $(VENV) is ready)

# The demo needs the demo extras only (moto's S3 server, Pillow, numpy): no torch, no test tools.
$(DEMO_STAMP): pyproject.toml | system-demo
	$(call say,make demo: creating $(VENV) with $(PYTHON))
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(call say,make demo: installing datacache with its demo extras with pip: each package is named as it \
	  is fetched; then pip installs them all (about 60) without a word for about a minute)
	$(VENV)/bin/python -m pip install --no-compile -e '.[demo]'  # modules compile at first import
	touch $@

demo: system-demo $(DEMO_STAMP)
	$(call say,make demo: running 'datacache demo' (moto S3 + a local source: apply, warmup, read back, verify))
	$(VENV)/bin/datacache demo

test: venv
	$(call say,make test: running the tests (real servers and FUSE mounts: many minutes))
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25  # two processes: most tests wait on servers; files in collection order (tests/conftest.py: the long ones first); the 25 slowest are listed

clean:
	rm -rf $(VENV) build dist .pytest_cache .hypothesis
	find . -name __pycache__ -type d -prune -not -path './.git/*' -exec rm -rf {} +
	find . -name '*.egg-info' -type d -prune -not -path './.git/*' -exec rm -rf {} +
