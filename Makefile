# The two commands of the README: `make up` runs the whole stack, `make test` runs the checks.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test install browser lint typecheck pytest clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "fleet needs Python 3.11 or newer; set PYTHON=/path/to/python3.11"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,rl]'
	touch $(STAMP)

install: $(STAMP)

# The browser tests (tests/e2e) drive Debian's chromium through Playwright; CI never skips
# them, so a missing browser is installed (as root) or named, and the run stops.
CHROMIUM := /usr/bin/chromium
browser:
	@if [ ! -x $(CHROMIUM) ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
		else \
			echo "The browser tests need Debian's chromium at $(CHROMIUM)."; \
			echo "Install it as root:  apt-get install -y chromium"; \
			exit 1; \
		fi; \
	fi

up: install
	scripts/up.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy fleet scheduler workers fleetctl

pytest: install browser
	$(BIN)/python -m pytest

test: lint typecheck pytest

clean:
	rm -rf $(VENV) var
