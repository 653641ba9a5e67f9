# Two commands set everything up: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
BIN := $(VENV)/bin
DEMO_OUT ?= out/demo
# `RESETTRACE_EXPORTER=otlp make demo` streams the demo's spans to a collector instead
RESETTRACE_EXPORTER ?= file:$(DEMO_OUT)/spans.jsonl

.PHONY: demo test docs system-deps lint bench-overhead clean

$(STAMP): pyproject.toml setup.py src/resettrace/tracing/_fast.c src/resettrace/tracing/_layout.h
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch for Stable-Baselines3 first, one release (where its CPU build lies on the machine's
	# pip find-links, that one: about 750 MB; PyPI's Linux wheel is the CUDA build, GBs)
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[all,dev,stacks,jobs]'
	touch $(STAMP)

# mjlab's tests: in a venv of their own (mjlab pins mujoco~=3.11, the sim extra needs MuJoCo
# 4), the tracer core with mjlab and pytest; torch's CPU build pinned in the same install
# (else a CUDA build of GBs): about 2.3 GB and 5 minutes the first time
MJLAB_VENV := .venv-mjlab
MJLAB_STAMP := $(MJLAB_VENV)/.installed
# (after .venv: both build the same in-tree C extension)
$(MJLAB_STAMP): pyproject.toml setup.py src/resettrace/tracing/_fast.c src/resettrace/tracing/_layout.h | $(STAMP)
	test -x $(MJLAB_VENV)/bin/python || $(PYTHON) -m venv $(MJLAB_VENV)
	$(MJLAB_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(MJLAB_VENV)/bin/python -m pip install --quiet torch==2.13.0 -e '.[mjlab]' pytest
	touch $(MJLAB_STAMP)

demo: $(STAMP)
	RESETTRACE=trace RESETTRACE_EXPORTER=$(RESETTRACE_EXPORTER) \
	$(BIN)/resettrace bench collector --task g1_walk_flat --backend mujoco \
		--num-envs 1024 --warmup 20 --steps 800 --out $(DEMO_OUT) --report
	@echo "report: $(DEMO_OUT)/report.html (one self-contained file: open it in a browser)"

# system programs the suite runs for real: Debian's chromium and chromedriver (the report
# test) and prometheus (the metrics test)
system-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null \
		&& command -v prometheus >/dev/null || { \
		echo "installing chromium, chromium-driver and prometheus (apt-get, as root) for the tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq chromium chromium-driver prometheus; }

# the suite twice: with the compiled recorder, then with the pure-Python one that an install
# without a C compiler runs (they must record the same); each in two pytest-xdist workers
test: $(STAMP) $(MJLAB_STAMP) system-deps docs
	$(BIN)/python -m pytest -q -n 2
	RESETTRACE_PURE_PYTHON=1 $(BIN)/python -m pytest -q -n 2 -p no:cacheprovider
	$(MJLAB_VENV)/bin/python -m pytest -q -p no:cacheprovider tests_mjlab
	RESETTRACE_PURE_PYTHON=1 $(MJLAB_VENV)/bin/python -m pytest -q -p no:cacheprovider tests_mjlab
	$(BIN)/python -m pytest -q examples/own_env
	$(BIN)/python -m pytest -q -p no:cacheprovider --markdown-docs README.md docs

# the docs site (mkdocs, material theme) into build/site, configuration.md's table of
# variables generated first; a broken link or page fails it
docs: $(STAMP)
	$(BIN)/python -m resettrace.settings docs/configuration.md  # (its table of variables)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# ruff, mypy, and the layout's rules (the tracer never imports sim/ or bench/ but where a
# call loads them, no extra's package at a tracer module's top, no private name imported
# across modules, no import circle, docs/layout.md names every module: tests/test_layering.py)
lint: $(STAMP)
	$(BIN)/ruff check src tests tests_mjlab examples
	$(BIN)/mypy src
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_layering.py

bench-overhead: $(STAMP)
	$(BIN)/resettrace bench overhead --json out/overhead.json

clean:
	rm -rf $(VENV) $(MJLAB_VENV) out build *.egg-info
