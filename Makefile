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

.PHONY: setup setup-dev lessons test test-unit test-unit-1thread test-notebooks test-slow lab check format slides test-browser stress gpu-report spread kernel lock clean

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
	$(PY) scripts/run_lessons.py --markdown

test: setup-dev test-unit test-notebooks  ## unit tests, then nbval over every lesson and solution

test-unit: setup-dev
	$(PY) -m pytest tests

test-unit-1thread: setup-dev  ## the unit tests again on one thread (other CPU kernels, other rounding)
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider tests

test-notebooks: setup-dev
	$(PY) -m pytest --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg \
	  -p no:cacheprovider notebooks $(wildcard solutions/*.ipynb)

# the notebooks that start processes (torchrun jobs, run_workers' ranks), and their solutions
SLOW_NOTEBOOKS := notebooks/07-ddp-torchrun.ipynb notebooks/09-model-parallel.ipynb \
  notebooks/10-sharding.ipynb notebooks/11-synchronisation.ipynb \
  solutions/07-ddp-torchrun.ipynb solutions/09-model-parallel.ipynb \
  solutions/10-sharding.ipynb solutions/11-synchronisation.ipynb

test-slow: setup-dev  ## nbval again on one core shared with a busy loop: speed-dependent output fails
	$(PY) scripts/slow_machine.py $(SLOW_NOTEBOOKS)

lab: setup  ## JupyterLab on the lessons (diagrams and live training curves as in the browser test)
	$(PY) scripts/lab.py

kernel:  ## register the Python you run it with (PYTHON=..., default python3) as the kernel "Python 3 (d2l-gpu)"
	@$(PYTHON) -c "import ipykernel" 2>/dev/null || { echo "make kernel: $(PYTHON) has no ipykernel; run: $(PYTHON) -m pip install -e '.[notebook]'" >&2; exit 2; }
	$(PYTHON) -m ipykernel install --user --name d2l-gpu --display-name "Python 3 (d2l-gpu)"

stress: setup-dev  ## 40 two-rank torchrun jobs; prints how many exited non-zero (must be 0)
	$(PY) scripts/stress_ddp.py

gpu-report: setup-dev  ## on a machine with an accelerator: the acceptance run, build/gpu-report.md
	$(PY) scripts/gpu_report.py

spread: setup-dev  ## how much the "it learns" test figures vary here (seeds x options x threads)
	$(PY) benchmarks/learning_spread.py

check: setup-dev  ## lint and format check of .py and .ipynb, notebooks in normal form
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/nbtools.py check $(wildcard notebooks/*.ipynb solutions/*.ipynb)

format: setup-dev  ## ruff-format .py and .ipynb, then normalise the notebooks
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .
	$(PY) scripts/nbtools.py tidy $(wildcard notebooks/*.ipynb solutions/*.ipynb)

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
