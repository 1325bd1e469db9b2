# The two commands of the setup contract are `make demo` and `make test`; both build .venv
# on their own from a bare machine with Python 3.11+.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint proto bench clean

# Quiet on stdout, so that `make bench` and `make demo --output json` print only their own output.
$(STAMP): pyproject.toml
	@echo "installing devplug into $(VENV)" >&2
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip >&2
	@$(BIN)/python -m pip install -q -e '.[dev]' >&2
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/devplug demo

test: lint
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check src tests bench tools
	$(BIN)/ruff format --check src tests bench tools
	$(BIN)/mypy

proto: $(STAMP)
	$(BIN)/python tools/genproto.py

bench: $(STAMP)
	@$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .envtest
