# The two commands a new user needs: `make demo` and `make test`. Both create the virtual environment
# and install evald into it on first use.
# The interpreter the venv is made from (PYTHON=... names another): the distribution's python3.11 where it
# can make a venv and build extensions (Debian's python3.11-venv and python3.11-dev), else the first
# python3.11, then python3, on PATH. Debian builds its Python with profile-guided and link-time
# optimisation, which pyenv's default build (these machines' python3) has neither of: the suite's own
# Python takes about a fifth less CPU on it, the whole suite about 15 % less time (BENCHMARKS.md, "Test
# suite time"; python -m bench.interpreter).
DISTRIBUTION_PYTHON := /usr/bin/python3.11
PYTHON ?= $(shell $(DISTRIBUTION_PYTHON) -c 'import ensurepip, pathlib, sysconfig; assert (pathlib.Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()' 2>/dev/null && echo $(DISTRIBUTION_PYTHON) || command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-long test-prerequisites lint bench reliability docs clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "evald needs Python 3.11 or newer (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# DeepSpeed's setup.py imports torch, so it is built against the pinned CPU torch already in the venv
	# rather than in an isolated build environment (which would fetch another torch).
	$(BIN)/python -m pip install --quiet torch==2.13.0 setuptools wheel
	$(BIN)/python -m pip install --quiet --no-build-isolation 'deepspeed>=0.16'
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# DeepSpeed compiles its CPU shared-memory all-reduce (a C++ extension, about a minute) the first time
	# a CPU process group starts, into ~/.cache/torch_extensions; built here, the first evaluation (and the
	# first test that starts ranks) does not wait on the compiler. Loaded as a worker loads it: under a lock
	# a killed process cannot leave behind (torch's own, left by a killed load, hung this step for good).
	DS_ACCELERATOR=cpu $(BIN)/python -m inference.shm_op
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/evald demo

# Four test processes (pytest-xdist), a file each: most slow tests wait on a daemon, a trainer or a worker
# process, so the others fill those waits (on 2 cores, three used 156 % CPU and took 629 s, four 170 % and
# 502 s, measured on a fresh clone: BENCHMARKS.md). TEST_WORKERS=0 runs them in this process. The long
# scenarios, which time takeovers and outages, run in two (LONG_WORKERS).
TEST_WORKERS ?= 4
LONG_WORKERS ?= 2
# The dashboard's browser tests drive this Chromium (Debian's, which tests/prerequisites.sh installs where
# it can); the PostgreSQL tests use $EVALD_TEST_POSTGRES_URL, else the local server on 127.0.0.1:5432.
EVALD_CHROMIUM ?= /usr/bin/chromium
export EVALD_CHROMIUM

# What the suite needs is provided first, or named with the one command to run, before the virtual
# environment is built (tests/prerequisites.sh); then it is required: a missing browser or PostgreSQL
# fails those tests instead of skipping them.
test-prerequisites:
	@bash tests/prerequisites.sh

# The suite starts hundreds of Python processes (daemons, CLI calls, workers): with bytecode writing off
# (PYTHONDONTWRITEBYTECODE, as some shells set it) each compiled evald's modules from source again, 0.3 s
# of CPU per `evald` start. compileall writes the bytecode once, whatever that setting.
BYTECODE := $(BIN)/python -m compileall -q daemon evald inference storage tests

test: test-prerequisites $(STAMP)
	$(BYTECODE)
	EVALD_REQUIRE_BROWSER=1 EVALD_REQUIRE_POSTGRES=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m 'not long'

# The long multi-process scenarios (marker `long`: kill -9 through the daemon, outages longer than a lease,
# a Slurm job past its time limit, ...), each a repeat at full scale of what a faster test in `make test`
# covers in part. Every worker a fresh interpreter, as production starts it (EVALD_TEST_FORK=0: no fork
# server, tests/forkserver.py). Not in CI: before a release and after changing how the daemon runs processes.
test-long: test-prerequisites $(STAMP)
	$(BYTECODE)
	EVALD_TEST_FORK=0 EVALD_REQUIRE_BROWSER=1 EVALD_REQUIRE_POSTGRES=1 $(BIN)/python -m pytest -n $(LONG_WORKERS) --dist loadfile --no-loadscope-reorder -m long

# ruff, mypy, the architecture (lint-imports: the layers of daemon/ and no import circle, as
# [tool.importlinter] in pyproject.toml says) and the docs site built with --strict (broken links fail).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy daemon evald inference storage tests bench reliability docs/hooks
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir $$(mktemp -d)

bench: $(STAMP)
	$(BIN)/python -m bench.detection_latency
	$(BIN)/python -m bench.idle_cost
	$(BIN)/python -m bench.grading_throughput
	$(BIN)/python -m bench.grading_share
	$(BIN)/python -m bench.detector_quality
	$(BIN)/python -m bench.judging
	$(BIN)/python -m bench.alert_latency
	$(BIN)/python -m bench.api_latency --browser
	$(BIN)/python -m bench.metrics_scrape
	$(BIN)/python -m bench.worker_start
	$(BIN)/python -m bench.forked_worker
	$(BIN)/python -m bench.interpreter
	$(BIN)/python -m bench.daemon_start
	$(BIN)/python -m bench.code_sandbox --repeats 3
	$(BIN)/python -m bench.cli_latency

# The real daemon under injected faults (kill -9, PostgreSQL restarts, webhook outages, disk full, ...),
# full counts; writes the figures to RELIABILITY.md. Needs root (tmpfs mounts) and PostgreSQL binaries.
reliability: $(STAMP)
	$(BIN)/python -m reliability --write RELIABILITY.md

# The docs site (docs/, mkdocs.yml) into site/, which git ignores; the reference pages are generated from the
# code as it builds. --strict makes every warning an error: a broken link or anchor fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) *.egg-info .mypy_cache .ruff_cache .pytest_cache
