# Two commands a new user needs: `make demo` and `make test`. Both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-kernels lint bench docs clean gpu-campaign

$(BIN)/moquad: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	touch $(BIN)/moquad

setup: $(BIN)/moquad

demo: setup
	$(BIN)/moquad quickstart --out runs/quickstart

# The suite on every logical core (at most 4 workers: several tests start 2-3 processes each); a module's tests that share
# a module-scoped fixture stay on one worker (tests/conftest.py). One file alone: .venv/bin/python -m pytest FILE.
test: setup
	$(BIN)/python -m pytest -q -n logical --maxprocesses 4 --dist loadgroup

# The tests that compare numbers stored in the repository (@pytest.mark.stored), under each kernel setting of
# tests/kernels.py (the machine's default, AVX2, SSE4.1): run it before recording a golden file (CONTRIBUTING.md).
test-kernels: setup
	$(BIN)/python tests/kernels.py

lint: setup
	$(BIN)/ruff check moquad tests benchmarks experiments

bench: setup
	$(BIN)/python benchmarks/bench_preprocess.py
	$(BIN)/python benchmarks/bench_loader.py
	$(BIN)/pip install -q -c constraints.txt -e ".[bench]" || echo "bench_decoders: the [bench] extra did not install; its rows say why"; $(BIN)/python benchmarks/bench_decoders.py
	$(BIN)/python benchmarks/bench_step.py
	$(BIN)/python benchmarks/bench_scale.py

# One GPU allocation with a time limit (docs: "Running the GPU campaign"): the campaign's jobs not yet done for this
# code, within BUDGET seconds; runs with the machine's python3 (its torch), no venv. JOBS=paths,decode,ladder names
# jobs; OUT is where the records go (a folder to copy back from a remote machine).
BUDGET ?= 540
OUT ?= docs/results/gpu
gpu-campaign:
	PYTHONUNBUFFERED=1 python3 experiments/gpu_campaign.py --budget-s $(BUDGET) --out $(OUT) $(if $(JOBS),--jobs $(JOBS))

clean:
	rm -rf runs .pytest_cache site

docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
