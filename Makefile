# Two entry points: `make run` (the default experiment) and `make test` (the whole suite).
# Both create ./.venv on first use and install fedcomp into it.
PYTHON ?= python3
VENV ?= .venv
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: run test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

run: $(STAMP)
	$(VENV)/bin/fedcomp run quickstart

test: $(STAMP)
	RAY_AUTH_MODE=disabled $(VENV)/bin/python -m pytest

bench: $(STAMP)
	$(VENV)/bin/fedcomp bench

clean:
	rm -rf results .pytest_cache
