# The two set-up commands (README): `make demo` and `make test`. Both create .venv on a fresh machine.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_WORKERS ?= 2  # pytest-xdist workers: the suite is mostly single-threaded compiles; worksteal evens their ends

.PHONY: demo test lint test-all test-avx2 edge-deps edge-test clean corpus conformance integrations

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q 'torch==2.13.0'  # first, so the extra below finds it (the +cpu wheel on this machine)
	$(BIN)/python -m pip install -q -e '.[dev,torch,tflite,grpc,serve-clients]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m kiln.demo

# the edge tools are installed when this machine allows it (root, package registries); if not,
# tests/edge skips and -rs prints why
test: $(STAMP)
	@$(MAKE) -s edge-deps || echo "make test: could not install the edge tools (cross toolchain, qemu-user, aarch64 TVM runtime): tests/edge will skip"
	@command -v wrk >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null) || \
	  echo "make test: could not install wrk (Debian's package): tests/serve/test_wrk.py will skip"
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist worksteal --durations=15

# ruff at 120 columns (pyproject's [tool.ruff]): lint, then formatting, then the size budget (no function over 80
# lines, no file over 500; today's offenders in tools/size_budget_allow.txt); .ci/run calls it before make test
LINTED := kiln tests benchmarks fuzz tools
lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/python tools/size_budget.py

# The edge checks: cross toolchain and qemu-user (Debian packages), the aarch64 TVM runtime (from the
# aarch64 apache-tvm wheel), then the C++ runner's tests. `make test` runs them too when these are there.
EDGE := build/edge/aarch64
edge-deps: $(STAMP)
	command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++-aarch64-linux-gnu qemu-user >/dev/null)
	$(BIN)/python -m kiln.runtime.cpp.fetch_runtime aarch64 $(EDGE) >/dev/null

edge-test: edge-deps
	$(BIN)/python -m pytest -q -rs tests/edge

# The suite with every default compile for an AVX2-only CPU (Zen 3), on an AVX-512 host: the AVX2 kernels' numerics
# run here, since AVX2-only hosts are rare. Tests that expect a kernel of some ISA read the default target, not the
# host (tests/helpers.py: target_cpu_flags, default_caps); AVX-512-only kernels' tests skip and say so.
test-avx2: $(STAMP)
	KILN_TARGET="llvm -mcpu=znver3" $(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist worksteal

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ''

# The serving integrations' tests with the engines they integrate with: Ray Serve (a local loopback cluster) from a
# side folder on PYTHONPATH, KServe in a venv of its own (kserve pins protobuf and psutil below what .venv's grpc
# extra has). Neither is in `make test`: Ray starts a cluster, and both extras conflict with Kiln's dev extras.
INTEG := build/integrations
integrations: $(STAMP)
	test -d $(INTEG)/ray/ray || $(BIN)/python -m pip install -q --target $(INTEG)/ray 'ray[serve]>=2.40'
	test -x $(INTEG)/kserve-venv/bin/python || $(PY) -m venv $(INTEG)/kserve-venv
	$(INTEG)/kserve-venv/bin/python -c 'import kserve' 2>/dev/null || \
	  $(INTEG)/kserve-venv/bin/python -m pip install -q 'kserve>=0.15'
	PYTHONPATH=$(INTEG)/ray $(BIN)/python -m pytest -q -rs -m '' tests/integrations/test_ray.py
	KILN_KSERVE_PYTHON=$(INTEG)/kserve-venv/bin/python $(BIN)/python -m pytest -q -rs tests/integrations/test_kserve.py

# The ONNX backend node tests (onnx's conformance cases) through Kiln and onnxruntime: benchmarks/conformance.md
conformance: $(STAMP)
	$(BIN)/python -m benchmarks.conformance --out benchmarks/conformance.md

# The corpus of real exported models (benchmarks/corpus): the exporters (torch, torchvision, transformers) live in
# their own venv, never in Kiln's; export.py fills build/corpus, run.py compiles and checks each model with Kiln.
CORPUS_VENV := .venv-corpus
CORPUS_STAMP := $(CORPUS_VENV)/.installed
$(CORPUS_STAMP):
	test -x $(CORPUS_VENV)/bin/python || $(PY) -m venv $(CORPUS_VENV)
	$(CORPUS_VENV)/bin/python -m pip install -q torch==2.14.1 torchvision==0.29.1 transformers onnx onnxscript onnxruntime
	touch $(CORPUS_STAMP)

corpus: $(STAMP) $(CORPUS_STAMP)
	$(CORPUS_VENV)/bin/python benchmarks/corpus/export.py
	$(BIN)/python benchmarks/corpus/run.py

clean:
	rm -rf $(VENV) build *.egg-info
