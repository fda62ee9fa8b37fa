# The two set-up commands (README): `make demo` and `make test`. Both create .venv on a fresh machine.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all edge-test clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m kiln.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -rs

# The edge checks: cross toolchain and qemu-user (Debian packages), the aarch64 TVM runtime (from the
# aarch64 apache-tvm wheel), then the C++ runner's tests. `make test` runs them too when these are there.
EDGE := build/edge/aarch64
edge-test: $(STAMP)
	command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null || \
	  (apt-get update -qq && apt-get install -y -qq g++-aarch64-linux-gnu qemu-user)
	$(BIN)/python -m kiln.runtime.cpp.fetch_runtime aarch64 $(EDGE)
	$(BIN)/python -m pytest -q -rs tests/edge

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ''

clean:
	rm -rf $(VENV) build *.egg-info
