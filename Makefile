# d2l-gpu: `make lessons` runs every lesson, `make test` runs the whole suite.
# Every target but `lock` calls scripts/course.py, which does the same on Linux, macOS and Windows
# (`python scripts/course.py COMMAND`): it creates .venv, installs the learners' lock
# (requirements.txt) for `setup` and `lessons`, and the maintainers' lock (requirements-dev.txt)
# on top for the others.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
export VENV
COURSE := $(PYTHON) scripts/course.py

.PHONY: setup setup-dev lessons test test-other-cpu test-cluster test-unit test-notebooks test-slow test-oldest lab check format slides test-browser site stress gpu-report fuzz spread grading-course kernel lock clean

setup:  ## create .venv with the learners' lock and the package
	$(COURSE) setup

setup-dev:  ## setup, then the maintainers' lock
	$(COURSE) setup-dev

lessons:  ## execute every lesson headless into build/, then print a summary (D2L_GPU_LANG=zh or vi: the Chinese or Vietnamese ones)
	$(COURSE) lessons

test:  ## unit tests and strict nbval over every lesson and solution, spread over the cores
	$(COURSE) test

test-other-cpu:  ## make test as an older CPU computes (AVX2 or plain kernels, one thread a process)
	$(COURSE) test-other-cpu

test-unit:
	$(COURSE) test-unit

test-notebooks:
	$(COURSE) test-notebooks

test-cluster:  ## a real Slurm cluster and two hosts in network namespaces (Linux, root)
	$(COURSE) test-cluster

test-oldest:  ## unit tests and lax nbval on PyTorch 2.4.1 (the oldest admitted), in .venv-oldest
	$(COURSE) test-oldest

test-slow:  ## nbval again on one core shared with a busy loop: speed-dependent output fails
	$(COURSE) test-slow

lab:  ## JupyterLab on the lessons (D2L_GPU_LANG=zh or vi: opens the Chinese or Vietnamese ones); diagrams and live curves
	$(COURSE) lab

kernel:  ## register the Python you run it with (PYTHON=..., default python3) as the kernel "Python 3 (d2l-gpu)"
	$(COURSE) kernel

stress:  ## 40 two-rank torchrun jobs; prints how many exited non-zero (must be 0)
	$(COURSE) stress

gpu-report:  ## on a machine with an accelerator: the acceptance run, build/gpu-report.md (PART=name: one part; scripts/gpu_report.py --plan)
	$(COURSE) gpu-report

fuzz:  ## the property-based sweeps of every public function and flag, many random examples each
	$(COURSE) fuzz

grading-course:  ## the exercises as an nbgrader course in build/grading (docs/grading.md)
	$(COURSE) grading-course

spread:  ## how much the "it learns" test figures vary here (seeds x options x threads)
	$(COURSE) spread

check:  ## lint and format check of .py and .ipynb, notebooks in normal form
	$(COURSE) check

format:  ## ruff-format .py and .ipynb, then normalise the notebooks
	$(COURSE) format

slides:  ## offline reveal.js decks under build/slides (fetches reveal.js with npm once)
	$(COURSE) slides

site:  ## the course website, English and Chinese, in build/site/ (Sphinx; the decks first)
	$(COURSE) site

test-browser:  ## each lesson run in JupyterLab in headless Chromium; each deck and website page viewed
	$(COURSE) test-browser

lock:  ## re-resolve both locks from requirements*.in (needs the registry and a CPU torch 2.13.0 wheel, as on the project's machines)
	rm -rf build/lockenv && $(PYTHON) -m venv build/lockenv
	build/lockenv/bin/pip install --quiet pip-tools
	build/lockenv/bin/pip-compile --quiet --upgrade --strip-extras --annotation-style line \
	  --no-emit-find-links --no-emit-index-url -o requirements.txt requirements.in
	sed -i 's/^torch==\([0-9.]*\)+cpu /torch==\1     /' requirements.txt  # any build of that version
	build/lockenv/bin/pip-compile --quiet --upgrade --strip-extras --annotation-style line \
	  --no-emit-find-links --no-emit-index-url -o requirements-dev.txt requirements-dev.in
	build/lockenv/bin/pip-compile --quiet --upgrade --strip-extras --annotation-style line \
	  --no-emit-find-links --no-emit-index-url -o requirements-site.txt requirements-site.in

clean:
	$(COURSE) clean
