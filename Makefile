# Two entry points: `make run` (the default experiment) and `make test` (the whole suite, what CI runs);
# `make check` is the fast tier for development (no slow tests, Ray only in a few smoke tests).
# All create ./.venv on first use and install fedcomp into it.
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
# Two test processes, each taking the next test module as it finishes one (each starts its own Ray session if it
# runs a Ray test; a module's tests run in one process, in order, so its keeping tests share kept actors).
# PARALLEL= runs the suite in one process.
PARALLEL ?= -n 2 --dist loadfile

.PHONY: run test check bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

run: $(STAMP)
	$(VENV)/bin/fedcomp run quickstart

test: $(STAMP)
	RAY_AUTH_MODE=disabled $(VENV)/bin/python -m pytest $(PARALLEL)

check: $(STAMP)
	RAY_AUTH_MODE=disabled $(VENV)/bin/python -m pytest $(PARALLEL) -m "not slow and (not ray or smoke)"

bench: $(STAMP)
	$(VENV)/bin/fedcomp bench

clean:
	rm -rf results .pytest_cache
