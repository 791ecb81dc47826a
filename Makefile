# The two commands of the README: `make serve` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= conf/config.json
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: serve test venv demo-models bench clean

venv: $(STAMP)

# torch is pinned to the CPU build that lies on local disk; a looser pin pulls a multi-GB CUDA build.
# text-generation 0.7 (TGI's client, used by the tests) pins huggingface-hub<1 which transformers 5 outgrows:
# it is installed without its pins, its real needs (requests, aiohttp, pydantic) come from the [test] extra.
$(STAMP): setup.cfg pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(VPY) -m pip install -q --disable-pip-version-check -e '.[test]'
	$(VPY) -m pip install -q --disable-pip-version-check --no-deps text-generation==0.7.0
	touch $(STAMP)

demo-models: $(STAMP)
	$(VPY) -m mindie_service demo-model --preset tiny --out models/tiny --if-missing

test: $(STAMP) demo-models
	$(VENV)/bin/lint-imports --no-cache
	$(VPY) -m pytest -q -ra --durations=20 tests

serve: $(STAMP)
	$(VPY) -m mindie_service serve --config $(CONFIG) --prepare

bench: $(STAMP)
	$(VPY) tools/bench_engine.py

clean:
	rm -rf $(VENV) models build *.egg-info
