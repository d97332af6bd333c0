# `make run` and `make test` are each the one command a fresh machine needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Two stamps: the package alone (what running needs) and the package with the dev extras
# (pytest, ruff, mypy, hypothesis, playwright: what testing and linting need).
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test lint format bench clean

define venv
@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "opsloop needs Python 3.11 or newer")'
@test -x $(PY) || $(PYTHON) -m venv $(VENV)
$(PY) -m pip install --quiet --upgrade pip
endef

$(STAMP): pyproject.toml
	$(venv)
	$(PY) -m pip install --quiet -e .
	@touch $(STAMP)

# The dev install holds the package too, so it renews both stamps: `make run` after
# `make test` installs nothing more.
$(DEV_STAMP): pyproject.toml
	$(venv)
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP) $(DEV_STAMP)

run: $(STAMP)
	$(VENV)/bin/opsloop local

test: $(DEV_STAMP)
	$(PY) -m pytest -q -n 3 --dist loadfile

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy bot engine localslack tools

format: $(DEV_STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	$(PY) bench/engine_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
