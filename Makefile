# Two commands: `make lab` opens the course, `make test` runs every test. Both do all set-up first,
# and a second run reinstalls nothing (stamp files record what is installed).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
COURSE_STAMP := $(VENV)/.course-installed
TEST_STAMP := $(VENV)/.test-installed
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
LAB_ARGS ?=
PYTEST_ARGS ?=
# nbval re-runs every notebook and compares its text outputs with the committed ones.
NBVAL_ARGS := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=300
# JupyterLab refuses to run as root unless told to; containers and CI run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: lab test lint test-portable bench bench-busy setup setup-test dot browser execute-notebooks html site-for-tests npm a11y-for-tests clean

# Without dot the course's drawings fall back to text (docs/setup.md, "Set-up without make"), so the lab only
# warns; the targets that depend on `dot` (test, test-portable, execute-notebooks, bench) stop: they
# test, save or time the notebooks with their drawings as pictures.
# The committed notebooks' outputs are the course's own: trusted, JupyterLab draws their saved widget panels before
# a cell runs (an untrusted notebook shows a panel as its text, "VBox(children=...)").
lab: setup
	@bash scripts/ensure-dot.sh --warn-only
	@$(VENV)/bin/jupyter trust notebooks/*.ipynb >/dev/null
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

# The 20 slowest tests are listed at the end (the suite runs near its 30-minute budget on a 2-core machine).
# tests/browser/ (JupyterLab in Chromium, marker `browser`) is collected with the rest; skip it with
# PYTEST_ARGS="-m 'not browser'".
test: setup-test dot browser site-for-tests a11y-for-tests
	@$(MAKE) --no-print-directory lint
	$(PY) -m pytest $(NBVAL_ARGS) --durations=20 $(PYTEST_ARGS) tests notebooks
	@$(MAKE) --no-print-directory test-portable

# The code's habits (pyproject.toml): ruff's lint and format check, mypy (the core strict, the lessons checked)
# and import-linter's layer contracts (the core never imports a lesson; no lesson imports another).
lint: setup-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The notebook suite once more on PyTorch's plainest CPU kernels and one thread: an output that nbval
# compares must be the same on every CPU (AVX-512, AVX2, none) and thread count, so it fails here on
# every machine instead of on some. See CONTRIBUTING.md, "Changing a notebook".
PORTABLE_ENV := ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
test-portable: setup-test dot
	$(PORTABLE_ENV) $(PY) -m pytest -p no:cacheprovider $(NBVAL_ARGS) notebooks

setup: $(COURSE_STAMP) $(LAB_OVERRIDES)
setup-test: $(TEST_STAMP)

# JupyterLab's defaults in the course's environment: no news or update toast over the notebook a learner opens.
$(LAB_OVERRIDES): scripts/lab/overrides.json | $(COURSE_STAMP)
	mkdir -p $(dir $@)
	cp $< $@

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The tool (backward_twice, pyproject.toml) and the course's helpers (course/pyproject.toml), both editable and
# --no-deps: the pinned requirements already hold everything, and an unpinned `torch` dependency must never reach
# the resolver (it would fetch a multi-GB CUDA build). backward-twice-helpers is what an older checkout installed.
$(COURSE_STAMP): requirements.txt pyproject.toml course/pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip uninstall --quiet --yes backward-twice-helpers 2>/dev/null || true
	$(PY) -m pip install --quiet --no-deps -e . -e course/
	touch $@

$(TEST_STAMP): requirements-test.txt $(COURSE_STAMP)
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-test.txt
	touch $@

dot:
	@bash scripts/ensure-dot.sh

# Chromium for the browser tests: apt-get when root on Debian/Ubuntu, otherwise the command to run
# (the tests then skip; with CI=true this step fails instead).
browser:
	@bash scripts/ensure-chromium.sh

# Re-run every notebook top to bottom in a fresh kernel and save outputs and widget state.
execute-notebooks: setup dot
	$(VENV)/bin/jupyter execute --inplace notebooks/*.ipynb

# The offline copy: site/ (an index, one page per notebook from its committed outputs, the Chinese
# pages) and site.zip, for reading without a network. nbconvert's CDN scripts are replaced by the widget
# renderer that npm installs here from the pinned package-lock.json (npm ci, once: the stamp records it);
# scripts/build_site.py itself rebuilds only when a notebook, page or template changed.
SITE_NPM := build/site-npm
SITE_NPM_STAMP := $(SITE_NPM)/.installed
html: setup $(SITE_NPM_STAMP)
	$(PY) scripts/build_site.py

$(SITE_NPM_STAMP): scripts/site/package.json scripts/site/package-lock.json
	@command -v npm >/dev/null 2>&1 || { bash scripts/ensure-npm.sh; command -v npm >/dev/null 2>&1; } || \
		{ echo "make html needs npm: sudo apt-get install -y npm" >&2; exit 1; }
	mkdir -p $(SITE_NPM)
	cp scripts/site/package.json scripts/site/package-lock.json $(SITE_NPM)/
	cd $(SITE_NPM) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $@

# npm for the offline copy: apt-get when root on Debian/Ubuntu, otherwise the command to run.
npm:
	@bash scripts/ensure-npm.sh

# make test builds the offline copy its tests read (tests/test_site.py, tests/browser/test_offline_site.py);
# without npm they skip (ensure-npm.sh fails instead under CI=true), as the browser tests do without Chromium.
site-for-tests: setup npm
	@if command -v npm >/dev/null 2>&1; then $(MAKE) --no-print-directory html; fi

# axe-core for the accessibility browser test (tests/browser/test_dark_theme_and_axe.py), pinned in
# scripts/a11y/package-lock.json and installed with npm ci into build/a11y-npm/ (once: the stamp records it).
# Without npm that test skips (ensure-npm.sh fails instead under CI=true), like the site tests.
A11Y_NPM := build/a11y-npm
A11Y_NPM_STAMP := $(A11Y_NPM)/.installed
$(A11Y_NPM_STAMP): scripts/a11y/package.json scripts/a11y/package-lock.json
	mkdir -p $(A11Y_NPM)
	cp scripts/a11y/package.json scripts/a11y/package-lock.json $(A11Y_NPM)/
	cd $(A11Y_NPM) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error
	touch $@

a11y-for-tests: npm
	@if command -v npm >/dev/null 2>&1; then $(MAKE) --no-print-directory $(A11Y_NPM_STAMP); fi

bench: setup-test dot
	$(PY) benchmarks/bench_meter.py
	$(PY) benchmarks/bench_notebook.py
	$(PY) benchmarks/bench_recorder.py
	$(PY) benchmarks/bench_watch.py

# The notebooks' run times again with a busy loop on another core (a laptop doing something else, a shared CPU).
bench-busy: setup-test dot
	$(PY) benchmarks/bench_notebook.py --busy

clean:
	rm -rf $(VENV) .pytest_cache $(SITE_NPM) $(A11Y_NPM) site site.zip
