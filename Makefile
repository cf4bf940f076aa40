# nbscale developer commands. `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test bench lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(PY) examples/run_notebook.py examples/quickstart.ipynb

test: venv
	$(PY) -m pytest -q -ra

bench: venv
	$(PY) bench/run_all.py --write BENCHMARKS.md

lint: venv
	$(VENV)/bin/ruff check nbscale tests bench examples

clean:
	rm -rf $(VENV) build dist .pytest_cache
