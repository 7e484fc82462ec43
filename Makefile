# Two commands a new user needs: `make demo` and `make test`. Both create .venv when missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench clean

$(BIN)/moquad: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	touch $(BIN)/moquad

setup: $(BIN)/moquad

demo: setup
	$(BIN)/moquad quickstart --out runs/quickstart

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check moquad tests benchmarks

bench: setup
	$(BIN)/python benchmarks/bench_preprocess.py
	$(BIN)/python benchmarks/bench_loader.py
	$(BIN)/pip install -q -c constraints.txt -e ".[bench]" || echo "bench_decoders: the [bench] extra did not install; its rows say why"; $(BIN)/python benchmarks/bench_decoders.py
	$(BIN)/python benchmarks/bench_step.py
	$(BIN)/python benchmarks/bench_scale.py

clean:
	rm -rf runs .pytest_cache
