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

# make demo PORT=8001 (web server); the example env and agent keep ENV_PORT and AGENT_PORT.
PORT ?= 8000
ENV_PORT ?= 9101
AGENT_PORT ?= 9102
demo: $(BIN)/.installed
	$(BIN)/python manage.py demo --port $(PORT) --env-port $(ENV_PORT) --agent-port $(AGENT_PORT) $(DEMO_ARGS)

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q

# Benchmarks (see benchmarks/README.md). DB=postgres runs them on 127.0.0.1:5432 instead of SQLite.
DB ?= sqlite
.PHONY: bench-overhead bench-latency bench-storage bench-inflight bench-profile bench-jsonl bench-search bench-trajectory bench-trajectory-content bench-team screenshots
bench-overhead: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_overhead --db $(DB)
bench-latency: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_latency --db $(DB)
bench-trajectory: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_trajectory_page --db $(DB)
bench-trajectory-content: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_trajectory_content
screenshots: $(BIN)/.installed
	$(BIN)/python scripts/screenshots.py
bench-storage: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_storage --db $(DB)
bench-inflight: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_inflight --db $(DB)
bench-profile: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_profile --db $(DB)
bench-jsonl: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_jsonl_line
bench-search: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_search --db $(DB)
# 20 users browsing gunicorn during a 2,000-rollout qcluster run (DB=postgres: PostgreSQL + Redis at
# GYMWEB_REDIS_URL); BENCH_PORT picks gunicorn's port (default 9300).
bench-team: $(BIN)/.installed
	GYMWEB_ALLOW_LOCAL_TARGETS=1 $(BIN)/python -m benchmarks.bench_team --db $(DB)
