# nbscale developer commands. `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test chromium bench lint typecheck clean reference examples

$(STAMP): pyproject.toml constraints.txt labextension/package.json
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/jupyter labextension develop --overwrite .
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(PY) examples/run_notebook.py examples/quickstart.ipynb

test: venv chromium
	cd labextension && (test -d node_modules || npm install --no-audit --no-fund) && npm test
	$(PY) -m pytest -q -ra

# Debian's headless Chromium for the JupyterLab browser test (Playwright drives it; no Playwright browser download)
chromium:
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)

bench: venv
	$(PY) bench/run_all.py --write BENCHMARKS.md

lint: typecheck
	$(VENV)/bin/ruff check nbscale tests bench examples
	cd labextension && npm run lint

# mypy over nbscale/, settings in pyproject.toml ([tool.mypy])
typecheck: venv
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache

# docs/reference.md is made from the code (every magic flag, TrainingOptions field, NBSCALE_* variable)
reference: venv
	$(PY) -m tests.reference_doc --write

# re-run every example notebook and commit it with its outputs (tests/test_examples_current.py checks them)
examples: venv
	for notebook in examples/*.ipynb; do $(PY) examples/run_notebook.py --save $$notebook || exit 1; done
