# The two commands of the setup contract are `make demo` and `make test`; both build .venv
# on their own from a bare machine with Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Every extra, for the tests; the development tools come from the `dev` dependency group
# (PEP 735, pip >= 25.1), which is not published with the package.
EXTRAS := dra,envtest,fleet,report,udev

.PHONY: demo test test-node test-other lint proto dist bench fleet-bench fleet-bench-synthetic fleet-bench-dra soak clean image image-deps node-deps browser-deps

# Quiet on stdout, so that `make bench` and `make demo --output json` print only their own output.
$(STAMP): pyproject.toml
	@echo "installing devplug into $(VENV)" >&2
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade 'pip>=25.1' >&2
	@$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]' --group dev >&2
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/devplug demo

# Two runs side by side: the real node's and the image's tests in one process (the
# cluster is one per machine, and they share it), everything else on TEST_WORKERS
# workers (pytest-xdist), a test file per worker at a time (its module fixtures built
# once). The tests wait on processes, sockets and API servers as much as they compute:
# on 2 cores, 3 workers beside the real node's run used 1.5 cores where 2 left them
# half idle (12 min 14 s against 13 min 20 s).
TEST_WORKERS ?= 3
# By the tier markers (tests/conftest.py gives each test its folder's), so that no tier
# is left out of both.
NODE_TIERS := realnode or image
NODE_RUN = $(BIN)/python -m pytest -q -m "$(NODE_TIERS)"

# The lint runs beside both: the real node's lane waits on its cluster and containers
# more than it computes, so mypy's minute off its path shortens the whole run.
test: image-deps node-deps browser-deps $(STAMP)
	@$(MAKE) -s -j3 --output-sync=target lint test-node test-other

test-node: $(STAMP)
	$(NODE_RUN)

test-other: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not ($(NODE_TIERS))"

lint: $(STAMP)
	$(BIN)/ruff check src tests bench tools
	$(BIN)/ruff format --check src tests bench tools
	$(BIN)/mypy

proto: $(STAMP)
	$(BIN)/python tools/genproto.py

# The wheel and the sdist in dist/, checked: their metadata (twine), and the LICENSE and
# py.typed inside each.
DIST ?= dist
dist: $(STAMP)
	rm -rf $(DIST)
	$(BIN)/python -m build -q --outdir $(DIST) . >&2
	$(BIN)/twine check --strict $(DIST)/*
	$(BIN)/python tools/checkdist.py $(DIST)

bench: $(STAMP) image
	@$(BIN)/python bench/run.py

# openb's default trace on a fleet of its 1,213 GPU nodes: the real kube-scheduler with
# devplug's extender (policy FLEET_POLICY: fgd, bestfit, packing or default) places the
# paper's workload one pod at a time, beside the planner's answer for the same policy
# (docs/fleet.md; 8,312 pods one at a time: about 22 minutes on a quiet machine; JSON on
# stdout). FLEET_SAMPLE=N: N nodes drawn with the seed.
FLEET_POLICY ?= fgd
FLEET_SAMPLE ?=
fleet-bench: $(STAMP)
	@$(BIN)/python bench/fleet.py --openb --policy $(FLEET_POLICY) $(if $(FLEET_SAMPLE),--sample $(FLEET_SAMPLE))

# `devplug fleet` at full size: 1,000 nodes x 8 devices (each shared twice), 10,000 pods
# through the real kube-scheduler (minutes; JSON on stdout). `make bench`: 100 nodes.
fleet-bench-synthetic: $(STAMP)
	@$(BIN)/python bench/fleet.py --nodes 1000 --pods 10000

# The same 1,000 nodes serving their GPUs through DRA (8 per node, a ResourceSlice each),
# 4,000 pods with a claim each from a ResourceClaimTemplate: claims made by the real
# resourceclaim controller, allocated by the real scheduler (client rate raised to
# 1,000 QPS), prepared by the nodes (minutes; JSON on stdout).
fleet-bench-dra: $(STAMP)
	@$(BIN)/python bench/fleet.py --dra --nodes 1000 --pods 4000

# The container image (Dockerfile) as an OCI archive, built with buildah from a Debian
# base made by mmdebstrap: no docker engine, no registry. Debian packages are installed
# only when missing (podman and containerd: the image test loads the archive into both).
IMAGE_TOOLS := buildah mmdebstrap umoci podman containerd
image-deps:
	@missing=$$(for t in $(IMAGE_TOOLS); do command -v $$t >/dev/null || echo $$t; done); \
	if [ -n "$$missing" ]; then \
		echo "installing $$missing" >&2; \
		apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >&2; \
	fi

# Debian's Chromium, headless: the test that opens `devplug plan --html` reports in it.
browser-deps:
	@command -v chromium >/dev/null || { echo "installing chromium" >&2; \
		apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2; }

# What the real one-node cluster of the tests (../shared/k8s/node.sh) runs from Debian:
# runc, the CNI plugins and a static busybox (its pod image), installed only when missing.
NODE_PACKAGES := runc containernetworking-plugins busybox-static
node-deps:
	@missing=$$(for p in $(NODE_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
		| grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing $$missing" >&2; \
		apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >&2; \
	fi

IMAGE_INPUTS := Dockerfile .dockerignore tools/image.sh pyproject.toml README.md \
	$(shell find src -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -not -path '*.egg-info/*')
build/devplug-image.tar: $(IMAGE_INPUTS) | image-deps $(STAMP)
	@tools/image.sh

image: build/devplug-image.tar

# The long fault runs (200 kubelet restarts, 500 flaps...): minutes; a table at the end.
soak: $(STAMP)
	$(BIN)/python tests/soak.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist .envtest
