# `make run` and `make test` are each the one command a fresh machine needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Two stamps: the package alone (what running needs) and the package with the dev extras
# (pytest, ruff, mypy, hypothesis, playwright: what testing and linting need).
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

# The MCP conformance suite (tests/tools/test_mcp_conformance.py) needs Node 22, which
# the npm registry serves as a package: both are installed here, once, beside the venv.
CONFORMANCE := .cache/conformance
CONFORMANCE_STAMP := $(CONFORMANCE)/.installed
CONFORMANCE_SUITE := @modelcontextprotocol/conformance@0.1.16
CONFORMANCE_NODE := node@22

.PHONY: run test lint format bench clean conformance

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

$(CONFORMANCE_STAMP): Makefile
	@command -v npm >/dev/null || { echo "npm is needed to install the MCP conformance suite"; exit 1; }
	@mkdir -p $(CONFORMANCE)
	npm install --silent --no-audit --no-fund --prefix $(CONFORMANCE) $(CONFORMANCE_NODE) $(CONFORMANCE_SUITE)
	@$(CONFORMANCE)/node_modules/.bin/node --version | grep -q '^v22\.' || { echo "Node 22 did not install in $(CONFORMANCE)"; exit 1; }
	@touch $@

conformance: $(CONFORMANCE_STAMP)

run: $(STAMP)
	$(VENV)/bin/opsloop local

test: $(DEV_STAMP) $(CONFORMANCE_STAMP)
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
	rm -rf $(VENV) .pytest_cache .ruff_cache $(CONFORMANCE)
