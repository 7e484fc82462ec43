# Two commands a new user needs: `make demo` and `make test`. Both create .venv when missing, from the lock.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Every package of the product and its extras (dev, hf, ray, bench), pinned with hashes for each Python the project
# supports: `make setup` installs exactly this, `make lock` rewrites it from pyproject.toml's ranges and the pins
# of constraints.txt. Plain `pip install -e .` still resolves the ranges.
LOCK := requirements-lock.txt
# uv reads no pip configuration: the package indexes pip is configured with (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL,
# PIP_FIND_LINKS or pip.conf: a site's mirror) serve uv too; the lock's hashes decide what is accepted from any index.
# --compile-bytecode: the .pyc files pip writes at install (without them every process compiles torch's sources
# anew where PYTHONDONTWRITEBYTECODE is set, about 5 s each)
pipconf = $(or $($(1)),$(shell $(PY) -m pip config get global.$(2) 2>/dev/null))
INDEXES = $(foreach u,$(call pipconf,PIP_INDEX_URL,index-url),--index-url $(u)) \
          $(foreach u,$(call pipconf,PIP_EXTRA_INDEX_URL,extra-index-url),--extra-index-url $(u)) \
          $(foreach u,$(call pipconf,PIP_FIND_LINKS,find-links),--find-links $(u))
UV = $(BIN)/uv pip install --python $(BIN)/python --compile-bytecode --index-strategy unsafe-best-match $(INDEXES)

.PHONY: setup demo test test-latest test-kernels lint bench docs clean gpu-campaign lock

$(BIN)/moquad: pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	awk '/^uv==/{p=1} p{print} p && !/\\$$/{exit}' $(LOCK) > $(VENV)/uv-lock.txt
	$(BIN)/pip install -q --no-deps --require-hashes -r $(VENV)/uv-lock.txt
	$(UV) -q --require-hashes --no-deps -r $(LOCK)
	$(UV) -q --no-deps -e .
	touch $(BIN)/moquad

setup: $(BIN)/moquad

demo: setup
	$(BIN)/moquad quickstart --out runs/quickstart

# The suite on every logical core (at most 4 workers: several tests start 2-3 processes each); a module's tests that share
# a module-scoped fixture stay on one worker (tests/conftest.py). One file alone: .venv/bin/python -m pytest FILE.
test: setup
	$(BIN)/python -m pytest -q -n logical --maxprocesses 4 --dist loadgroup

# The tests that compare numbers stored in the repository (@pytest.mark.stored), under each kernel setting of
# tests/kernel_settings.py (the machine's default, AVX2, SSE4.1): run it before recording a golden file (CONTRIBUTING.md).
test-kernels: setup
	$(BIN)/python tests/kernel_settings.py

lint: setup
	$(BIN)/ruff check moquad tests benchmarks experiments

bench: setup
	$(BIN)/python benchmarks/bench_preprocess.py
	$(BIN)/python benchmarks/bench_loader.py
	$(BIN)/python benchmarks/bench_decoders.py
	$(BIN)/python benchmarks/bench_step.py
	$(BIN)/python benchmarks/bench_scale.py

# One GPU allocation with a time limit (docs: "Running the GPU campaign"): the campaign's jobs not yet done for this
# code, within BUDGET seconds; runs with the machine's python3 (its torch), no venv. JOBS=paths,decode,ladder names
# jobs; OUT is where the records go (a folder to copy back from a remote machine).
BUDGET ?= 540
OUT ?= docs/results/gpu
gpu-campaign:
	PYTHONUNBUFFERED=1 python3 experiments/gpu_campaign.py --budget-s $(BUDGET) --out $(OUT) $(if $(JOBS),--jobs $(JOBS))

# The newest releases the ranges allow, in a venv of its own (.venv-latest, no lock): run it when the lock is
# refreshed and before a release (CONTRIBUTING.md). The pins of constraints.txt (PyTorch) still hold.
test-latest:
	rm -rf .venv-latest && $(PY) -m venv .venv-latest
	.venv-latest/bin/pip install -q -c constraints.txt -e ".[dev,hf,ray,bench]"
	.venv-latest/bin/pip freeze --exclude-editable > .venv-latest/freeze.txt
	MOQUAD_UNLOCKED=1 .venv-latest/bin/python -m pytest -q -n logical --maxprocesses 4 --dist loadgroup -p no:cacheprovider

# Rewrite the lock from pyproject.toml's ranges (every extra) and constraints.txt, for every supported Python.
lock: setup
	$(BIN)/uv pip compile pyproject.toml --all-extras --universal --python-version 3.10 --generate-hashes \
	  -c constraints.txt --no-header --quiet -o $(LOCK)

clean:
	rm -rf runs .pytest_cache site

docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
