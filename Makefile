# Two entry points: `make run` (the default experiment) and `make test` (the whole suite, what CI runs);
# `make check` is the fast tier for development (no slow tests, Ray only in a few smoke tests).
# All create ./.venv on first use and install fedcomp into it.
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
# Two test processes, each taking the next test module as it finishes one (each starts its own Ray session if it
# runs a Ray test; a module's tests run in one process, in order, so its keeping tests share kept actors).
# Modules go out in the order tests/conftest.py sorts them (costliest first, by tests/module_costs.json), not
# xdist's own (most tests first). PARALLEL= runs the suite in one process.
PARALLEL ?= -n 2 --dist loadfile --no-loadscope-reorder

.PHONY: run test check test-oldest bench clean

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

# The whole suite on the oldest torch that pyproject.toml admits, in a virtualenv of its own (several GB; not CI's):
# mypy is left out, as it checks fedcomp against the annotations of CI's torch.
OLDEST_VENV ?= .venv-oldest
OLDEST_TORCH ?= torch==2.4.1 torchvision==0.19.1
test-oldest:
	test -x $(OLDEST_VENV)/bin/python || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/pip install --quiet --upgrade pip
	$(OLDEST_VENV)/bin/pip install --quiet $(OLDEST_TORCH) -e '.[test]'
	RAY_AUTH_MODE=disabled $(OLDEST_VENV)/bin/python -m pytest $(PARALLEL) --deselect tests/test_lint.py::test_mypy_finds_nothing

bench: $(STAMP)
	$(VENV)/bin/fedcomp bench

clean:
	rm -rf results .pytest_cache
