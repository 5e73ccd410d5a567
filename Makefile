# d2l-gpu: `make lessons` runs every lesson, `make test` runs the whole suite.
# Both create .venv first: `make lessons` installs the learners' lock (requirements.txt), the
# other targets the maintainers' lock (requirements-dev.txt) on top.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
# Headless runs draw each training curve once, at the end (see d2l_gpu.plotting.Animator).
export D2L_GPU_LIVE_PLOTS ?= 0
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: setup setup-dev lessons test test-unit test-notebooks lab check format slides test-browser lock clean

setup: $(STAMP)

setup-dev: $(DEV_STAMP)

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $@

$(DEV_STAMP): $(STAMP) requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	@touch $@

lessons: setup  ## execute every lesson headless into build/, then print a summary
	$(PY) scripts/run_lessons.py

test: setup-dev test-unit test-notebooks  ## unit tests, then nbval over every lesson

test-unit: setup-dev
	$(PY) -m pytest tests

test-notebooks: setup-dev
	$(PY) -m pytest --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg \
	  -p no:cacheprovider notebooks

lab: setup  ## JupyterLab on the lessons
	$(VENV)/bin/jupyter lab notebooks

check: setup-dev  ## lint and format check of .py and .ipynb, notebooks in normal form
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/nbtools.py check $(wildcard notebooks/*.ipynb)

format: setup-dev  ## ruff-format .py and .ipynb, then normalise the notebooks
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
	$(PY) scripts/nbtools.py tidy $(wildcard notebooks/*.ipynb)

slides: setup-dev  ## offline reveal.js decks under build/slides (fetches reveal.js with npm once)
	$(PY) scripts/make_slides.py

test-browser: setup-dev slides  ## each lesson run in JupyterLab in headless Chromium; each deck viewed
	scripts/install_browser.sh
	D2L_GPU_BROWSER=1 $(PY) -m pytest -p no:cacheprovider tests/browser

lock:  ## re-resolve both locks from requirements*.in (needs the registry and a CPU torch 2.13.0 wheel, as on the project's machines)
	rm -rf build/lockenv && $(PYTHON) -m venv build/lockenv
	build/lockenv/bin/pip install --quiet pip-tools
	build/lockenv/bin/pip-compile --quiet --upgrade --strip-extras --annotation-style line \
	  --no-emit-find-links --no-emit-index-url -o requirements.txt requirements.in
	sed -i 's/^torch==\([0-9.]*\)+cpu /torch==\1     /' requirements.txt  # any build of that version
	build/lockenv/bin/pip-compile --quiet --upgrade --strip-extras --annotation-style line \
	  --no-emit-find-links --no-emit-index-url -o requirements-dev.txt requirements-dev.in

clean:
	rm -rf build .pytest_cache .ruff_cache
