# nbscale developer commands. `make demo` and `make test` do all the set-up on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# every direct and indirect dependency pinned to a set known to pass (`make lock` remakes it from a clean resolve)
LOCK := requirements/lock.txt
# Python writes its bytecode caches here too: where the environment sets PYTHONDONTWRITEBYTECODE (this project's
# machines do), every kernel and worker process the suite starts compiled nbscale's 30,000 lines again (an editable
# install: about a second each) and every pytest process rewrote every test module's asserts (about 10 s).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv wheel docs demo test test-fast test-latest test-oldest lock chromium slurm bench lint style typecheck clean reference examples screenshots

$(STAMP): pyproject.toml constraints.txt $(LOCK) labextension/package.json
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c $(LOCK) pip
	$(PY) -m pip install -q -c constraints.txt -c $(LOCK) -e ".[dev]"
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/jupyter labextension develop --overwrite .
	touch $(STAMP)

venv: $(STAMP)

# the release wheel in dist/, the JupyterLab extension built fresh into it (needs Node 20+; fails without);
# `pip install dist/nbscale-*.whl` then needs no Node. See docs/install.md.
wheel:
	rm -rf dist nbscale/labextension
	NBSCALE_REQUIRE_LABEXTENSION=1 $(PYTHON) -m pip wheel --no-deps -w dist .

demo: venv
	$(PY) examples/run_notebook.py examples/quickstart.ipynb

# The suite runs in PYTEST_WORKERS processes (pytest-xdist): most tests wait on kernels, pools and servers, so
# more processes than cores still pays. conftest.py keeps the tests that share a fixture in one process. Tests marked
# `alone` run first, by themselves: they start something with a fixed timeout the rest of the suite could exceed.
PYTEST_WORKERS ?= 3
PYTEST_PARALLEL = -n $(PYTEST_WORKERS) --dist load

test: venv chromium slurm
	cd labextension && (test -d node_modules || npm install --no-audit --no-fund) && npm test
	$(PY) -m pytest -q -ra -m alone --junitxml=build/test-times-alone.xml; alone=$$?; \
	$(PY) -m pytest $(PYTEST_PARALLEL) -q -ra -m "not alone" --durations=15 --junitxml=build/test-times.xml \
	  && exit $$alone

# the tests a change most likely breaks: everything not marked slow (few real kernels) or faults (fault injection)
test-fast: venv
	$(PY) -m pytest $(PYTEST_PARALLEL) -q -ra -m "not slow and not faults" --durations=10

# the suite against the newest releases of every dependency (torch and torchvision stay at constraints.txt's
# versions: others download several GB), in a venv of its own; not part of .ci/run. PYTEST_ARGS narrows it.
VENV_LATEST := .venv-latest
PYTEST_ARGS ?= -q -ra
test-latest: chromium
	test -x $(VENV_LATEST)/bin/python || $(PYTHON) -m venv $(VENV_LATEST)
	$(VENV_LATEST)/bin/python -m pip install -q --upgrade pip
	$(VENV_LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -c constraints.txt -e ".[dev]"
	$(VENV_LATEST)/bin/python -m pip freeze --exclude-editable > $(VENV_LATEST)/resolved.txt
	$(VENV_LATEST)/bin/python -m pytest $(PYTEST_ARGS)

# the suite at the floors of pyproject.toml's dependencies (torch 2.5, torchvision 0.20, numpy 1.26, pillow 10.1,
# IPython 7.34, ipykernel 6.29: requirements/oldest/constraints.txt), in a venv of its own; not part of .ci/run
# (torch 2.5's CUDA wheels are several GB). PYTEST_ARGS narrows it; .venv-oldest/resolved.txt lists what it got.
VENV_OLDEST := .venv-oldest
test-oldest: chromium
	test -x $(VENV_OLDEST)/bin/python || $(PYTHON) -m venv $(VENV_OLDEST)
	$(VENV_OLDEST)/bin/python -m pip install -q --upgrade pip
	$(VENV_OLDEST)/bin/python -m pip install -q -c requirements/oldest/constraints.txt -e ".[dev]"
	$(VENV_OLDEST)/bin/python -m pip freeze --exclude-editable > $(VENV_OLDEST)/resolved.txt
	$(VENV_OLDEST)/bin/python -m pytest $(PYTEST_ARGS)

# remake requirements/lock.txt from a clean resolve of pyproject.toml (with constraints.txt's torch), dated
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --upgrade pip
	.venv-lock/bin/python -m pip install -q -c constraints.txt ".[dev,lab,cluster,s3,examples]"
	mkdir -p requirements
	{ echo "# Every dependency of nbscale pinned, made by \`make lock\` on $$(date -u +%Y-%m-%d) from a clean resolve"; \
	  echo "# (Python $$(.venv-lock/bin/python -c 'import platform; print(platform.python_version())')). make venv installs with it: refresh it on purpose, then run make test."; \
	  .venv-lock/bin/python -m pip freeze --all --exclude nbscale --exclude setuptools --exclude wheel; } > $(LOCK)
	rm -rf .venv-lock

# Debian's headless Chromium for the JupyterLab browser test (Playwright drives it; no Playwright browser download)
chromium:
	test -x /usr/bin/chromium || (apt-get update && apt-get install -y chromium)

# a one-node SLURM cluster for tests/pool/test_slurm_*.py and tests/jobs/test_slurm_jobs.py (tests/slurm_cluster.py
# configures and starts it in a temp folder; the packages' own services are not used)
slurm:
	test -x /usr/sbin/slurmctld -a -x /usr/sbin/slurmd -a -x /usr/sbin/munged -a -x /usr/bin/sbatch || \
		(apt-get update && apt-get install -y slurmctld slurmd munge slurm-client)

bench: venv
	$(PY) bench/run_all.py --history bench/HISTORY.md

lint: typecheck style
	cd labextension && npm run lint

# ruff's rules and layout, settings in pyproject.toml ([tool.ruff]); CI runs it too
style: venv
	$(VENV)/bin/ruff check nbscale tests bench examples
	$(VENV)/bin/ruff format --check nbscale tests bench examples

# mypy over nbscale/, settings in pyproject.toml ([tool.mypy])
typecheck: venv
	$(VENV)/bin/mypy

# the docs site in site/ (mkdocs.yml): docs/*.md and an API reference from the docstrings; every warning, a
# broken link or anchor included, fails it. Offline, in seconds; CI runs it after the style and type gates.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) $(VENV_LATEST) $(VENV_OLDEST) build dist site .pytest_cache .mypy_cache

# docs/reference.md is made from the code (every magic flag, TrainingOptions field, NBSCALE_* variable)
reference: venv
	$(PY) -m tests.reference_doc --write

# re-run every example notebook and commit it with its outputs (tests/test_examples_current.py checks them)
examples: venv
	for notebook in examples/*.ipynb; do $(PY) examples/run_notebook.py --save $$notebook || exit 1; done

# retake the docs' pictures (docs/screenshot-*.png) with the browser tests, in Chromium; commit them
screenshots: venv chromium
	NBSCALE_WRITE_SCREENSHOTS=1 $(PY) -m pytest -q tests/labextension/test_browser.py
