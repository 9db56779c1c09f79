# The two commands a fresh clone needs: `make book` and `make test` (only python3 and make required).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Notebooks run on the CPU in the book build and the tests, whatever the machine has, so that outputs
# and runtimes are those the site reports.
export ATTENTION_COURSE_DEVICE ?= cpu
export PYTHONHASHSEED := 0

NOTEBOOKS := $(wildcard chapters/*.ipynb) $(wildcard exercises/*.ipynb) $(wildcard exercises/solutions/*.ipynb)

.PHONY: help install book test test-fast nbval lint browser-deps grader-deps bench numerics gpu-check exercises screenshot clean \
	course-model

help:
	@echo "make book       install into $(VENV), execute the lessons (in parallel, cached), build the site into _build/html"
	@echo "make test       install, then run the whole test suite (lint, library, notebooks, grader, site, nbval)"
	@echo "make bench      run the benchmarks (or only those named: make bench serving); figures go to _build/benchmarks.json"
	@echo "make numerics   re-run the lessons under other processors' rounding; list claims that break"
	@echo "make gpu-check  run every lesson and solution live at its GPU sizes (emulated without a GPU); list claims that break"
	@echo "make course-model  train the course model (about an hour on 2 cores, resumable) and write its checkpoint"
	@echo "make exercises  regenerate the learner notebooks in exercises/ from exercises/solutions/"
	@echo "make screenshot regenerate the README's screenshot of the site (_static/site-screenshot.png) from _build/html"
	@echo "make clean      remove _build (the site and the cache of executed notebooks)"

install: $(STAMP) grader-deps

# pip byte-compiles what it installs file by file, on one core (some 55 s of the install here); it installs
# without compiling and the files are compiled afterwards on every core. As with pip, a file that is not
# valid Python for this interpreter (a test fixture for a newer Python) is left uncompiled.
$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -r requirements.txt
	$(BIN)/python -c "import compileall, sysconfig; compileall.compile_dir(sysconfig.get_path('purelib'), quiet=2, workers=0)"
	$(BIN)/python -m pip install --quiet --no-deps -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (attention course)" > /dev/null
	touch $@

# What the site is built from: when none of it changed since the last successful build, `make book` does
# nothing (so `make test` right after `make book` builds nothing). When something did, the notebooks run
# first, in parallel, one thread each, in kernels forked from a process that has imported PyTorch once
# (_ext/course_execution.py, _ext/kernel_zygote.py): only those whose code cells changed, or
# every one when the library changed; the others come from the cache in _build/.jupyter_cache/. The site
# is then rebuilt whole, with warnings as errors. A fresh clone (CI) has no _build/ and executes everything.
BOOK_SOURCES := _config.yml _toc.yml intro.md references.bib requirements.txt pyproject.toml \
	$(wildcard chapters/*.md) $(NOTEBOOKS) $(wildcard _ext/*.py) \
	$(filter-out _static/site-screenshot.png,$(shell find _static src/attention_course -type f ! -path '*/__pycache__/*'))
BOOK_STAMP := _build/html/.built

book: $(BOOK_STAMP)

# Interactive figures (ac.interactive_figure) are precomputed into frames behind native HTML controls. One
# thread per kernel, also for a notebook the build executes itself (one the cache lacks).
$(BOOK_STAMP): export ATTENTION_COURSE_STATIC_FIGURES = 1
$(BOOK_STAMP): export OMP_NUM_THREADS = 1
$(BOOK_STAMP): export MKL_NUM_THREADS = 1
$(BOOK_STAMP): $(STAMP) $(BOOK_SOURCES)
	$(BIN)/python _ext/course_execution.py
	$(BIN)/jupyter-book build . -W -n --keep-going --all
	touch $@

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/nbstripout --verify $(filter-out $(wildcard exercises/*.ipynb),$(NOTEBOOKS))
	# learner notebooks keep their graded-<part>/check-<part> cell ids (grading/generate.py)
	$(BIN)/nbstripout --verify --keep-id $(wildcard exercises/*.ipynb)

# Fast feedback while writing: lint, library and structure tests, no notebook execution.
test-fast: lint
	$(BIN)/pytest -q tests/unit tests/notebooks/test_structure.py tests/notebooks/test_publishing.py

# Debian's Chromium drives the browser tests (no browser download works here); npm supplies local copies of the
# CDN assets the site loads (MathJax, RequireJS, the widget manager), since CI has no internet.
browser-deps:
	@command -v chromium > /dev/null || command -v chromium-browser > /dev/null || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium > /dev/null; \
	  else sudo -n apt-get update -qq && sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium > /dev/null; fi; }
	@test -d tests/browser/node_modules/axe-core || (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)

# The grader runs learners' code under bubblewrap (Debian package bubblewrap); without it, it refuses to grade.
grader-deps:
	@command -v bwrap > /dev/null || { \
	  echo "installing bubblewrap, which isolates learners' code when grading"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap > /dev/null; \
	  else sudo -n apt-get update -qq && sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap > /dev/null; fi; }

# The whole suite: lint; library, notebook-structure and grader tests (two workers with one thread each: two busy
# workers sharing threads stall each other); the book build, which executes every lesson and solution notebook
# once and fails on any error (their checks are asserts in cells), and nothing when `make book` already built
# the same sources; the built site, offline and in Chromium (two workers: each page's browser tests are one unit of
# work, on the worker that loads the page once per viewport; tests/conftest.py); then nbval, which runs every
# notebook of the book a second time and compares each cell's output with the build's (tests/nbval_sanitize.cfg
# lists what may differ).
# Each pytest run lists its 25 slowest steps; a test whose call takes over 60 s of CPU fails (tests/conftest.py,
# which also says how the two workers share the tests: one module at a time, heaviest first).
test: lint grader-deps
	OMP_NUM_THREADS=1 $(BIN)/pytest -q -n 2 --dist loadscope --no-loadscope-reorder --durations=25 tests/unit tests/notebooks tests/grading
	$(MAKE) book
	$(MAKE) browser-deps
	COURSE_SITE=$(CURDIR)/_build/html $(BIN)/pytest -q -n 2 --dist loadscope --durations=25 tests/book tests/browser
	$(MAKE) nbval

# nbval over the notebooks the book build executed (tests/book/nbval_reference.py): each runs again in a fresh
# kernel with the build's environment, two at a time, and every output must match the build's.
nbval: book
	$(BIN)/python -m tests.book.nbval_reference --run

# `make bench` runs every benchmark; `make bench serving induction_heads` runs the ones named (the names after
# `bench` are taken as benchmark names, not as targets).
BENCH_NAMES := $(if $(filter bench,$(MAKECMDGOALS)),$(filter-out bench,$(MAKECMDGOALS)))
bench: $(STAMP)
	$(BIN)/python -m attention_course.benchmarks $(BENCH_NAMES)
ifneq ($(BENCH_NAMES),)
$(BENCH_NAMES):
	@:
endif

# For authors: re-run the lessons under other processors' float rounding (AVX2 kernels, MKL's compatible
# path, one thread) and list every claim that fails; a claim about a trained model must hold on any machine.
numerics: $(STAMP)
	$(BIN)/python -m tests.notebooks.numerics

# For authors: execute every lesson and solution live, as on a Colab GPU runtime, at the GPU workloads (on the CPU
# with the GPU sizes forced when there is no GPU); list failing claims and cells stopped by the time limit. On a
# GPU machine without the course's environment it installs what it needs into .gpu-venv (from .whl/ if present).
# Options: GPU_CHECK_ARGS="--jobs 4 --cell-limit 600 chapters/01_why_attention.ipynb" (see --help).
gpu-check:
	$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) -m tests.notebooks.gpu_check --install $(GPU_CHECK_ARGS)

# For authors: train the course model from scratch and write its checkpoint into the package
# (src/attention_course/data/course_model/). About an hour on two cores, minutes on a GPU; it saves a resumable
# state in _build/course-model/ every few minutes, so running it again after an interruption continues the run.
# It prints the files' SHA-256 to paste into attention_course.course_model.CHECKSUMS. It uses a GPU when there is
# one (unlike the book, which stays on the CPU); COURSE_MODEL_DEVICE=cpu forces the CPU.
course-model: $(STAMP)
	$(if $(COURSE_MODEL_DEVICE),ATTENTION_COURSE_DEVICE=$(COURSE_MODEL_DEVICE),env -u ATTENTION_COURSE_DEVICE) \
	  $(BIN)/python -c "import sys; from attention_course.course_model import main; main(sys.argv[1:])" \
	  all --work _build/course-model

exercises: $(STAMP)
	$(BIN)/python -m attention_course.grading.generate

# The README's picture of the site: a lesson page of the built book in headless Chromium (tests/browser).
screenshot: book browser-deps
	$(BIN)/python -m tests.browser.screenshot

clean:
	rm -rf _build
