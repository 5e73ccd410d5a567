# d2l-gpu: `make lessons` runs every lesson, `make test` runs the whole suite.
# Both create .venv and install the pinned dependencies (requirements.txt) first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Headless runs draw each training curve once, at the end (see d2l_gpu.plotting.Animator).
export D2L_GPU_LIVE_PLOTS ?= 0
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: setup lessons test test-unit test-notebooks lab check format slides test-browser lock clean

setup: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e . 2>/dev/null \
	  || $(PY) -m pip install --quiet --no-deps -e .
	@touch $@

lessons: setup  ## execute every lesson headless into build/, then print a summary
	$(PY) scripts/run_lessons.py

test: setup test-unit test-notebooks  ## unit tests, then nbval over every lesson

test-unit: setup
	$(PY) -m pytest tests

test-notebooks: setup
	$(PY) -m pytest --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg \
	  -p no:cacheprovider notebooks

lab: setup  ## JupyterLab on the lessons
	$(VENV)/bin/jupyter lab notebooks

check: setup  ## lint and format check of .py and .ipynb, notebooks in normal form
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/nbtools.py check $(wildcard notebooks/*.ipynb)

format: setup  ## ruff-format .py and .ipynb, then normalise the notebooks
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
	$(PY) scripts/nbtools.py tidy $(wildcard notebooks/*.ipynb)

slides: setup  ## offline reveal.js decks under build/slides (fetches reveal.js with npm once)
	$(PY) scripts/make_slides.py

test-browser: setup slides  ## each lesson run in JupyterLab in headless Chromium; each deck viewed
	scripts/install_browser.sh
	D2L_GPU_BROWSER=1 $(PY) -m pytest -p no:cacheprovider tests/browser

lock:  ## re-resolve the lock file in a scratch venv (needs the registry and a CPU torch 2.13.0 wheel, as on the project's machines)
	rm -rf build/lockenv && $(PYTHON) -m venv build/lockenv
	build/lockenv/bin/pip install --quiet torch==2.13.0 numpy matplotlib ipykernel pytest nbval \
	  nbformat nbclient nbconvert jupyterlab ruff playwright
	{ head -n 2 requirements.txt; build/lockenv/bin/pip freeze | sed 's/+cpu$$//'; } > requirements.txt.new
	mv requirements.txt.new requirements.txt

clean:
	rm -rf build .pytest_cache .ruff_cache
