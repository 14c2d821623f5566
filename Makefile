# gymweb: `make demo` runs the dashboard with the example env and agent; `make test` runs the tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install collect-demo

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/python manage.py demo

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q
