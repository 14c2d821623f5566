# gymweb: `make demo` runs the dashboard with the example env and agent; `make test` runs the tests,
# `make test-fast` all but the slow ones, `make lint` ruff, mypy and the import contracts.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-fast lint install collect-demo

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(BIN)/.installed

# make demo PORT=8001 (web server); ENV_PORT= and AGENT_PORT= move the example env and agent
# (unset: the ports the first demo used, kept in the data directory; 9101 and 9102 at first).
PORT ?= 8000
demo: $(BIN)/.installed
	$(BIN)/gymweb demo --port $(PORT)$(if $(ENV_PORT), --env-port $(ENV_PORT))$(if $(AGENT_PORT), --agent-port $(AGENT_PORT)) $(DEMO_ARGS)

# PYTEST_ARGS: more pytest options (e.g. PYTEST_ARGS="-x tests/test_charts.py").
test: $(BIN)/.installed
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Everything but the tests marked slow (browser, gunicorn, workers in other processes, demo, durability).
# On pytest-xdist's workers, one per core; compiled test modules cached (__pycache__) between runs.
test-fast: $(BIN)/.installed
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -m "not slow" -n auto $(PYTEST_ARGS)

# ruff (lint and format check), mypy and the import-linter contracts; configured in pyproject.toml.
lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# Benchmarks (see benchmarks/README.md). DB=postgres runs them on 127.0.0.1:5432 instead of SQLite.
DB ?= sqlite
.PHONY: bench-overhead bench-latency bench-storage bench-inflight bench-profile bench-jsonl bench-search bench-trajectory bench-trajectory-content bench-team screenshots bench-inflight10k bench-long bench-vs-nemo bench-trainer bench-archive bench-faults bench-upload bench-import bench-reply-rss bench-scale-vs-nemo bench-scale bench-scale10k bench-scale-fleet
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
bench-inflight10k: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_inflight --db $(DB) --rollouts 10000 --latency-ms 30000 --calls 3
# Scale-out (issue 27): K real qcluster worker processes on one run (PostgreSQL + Redis db 8, and SQLite).
bench-scale: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_scale spread --db postgres
	$(BIN)/python -m benchmarks.bench_scale spread --db sqlite
bench-scale10k: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_scale inflight --rollouts 10000 --workers 2
	$(BIN)/python -m benchmarks.bench_scale inflight --rollouts 20000 --workers 4
bench-scale-fleet: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_scale fleet
bench-long: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_long --db $(DB)
bench-profile: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_profile --db $(DB)
bench-jsonl: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_jsonl_line
bench-search: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_search --db $(DB)
# Archive, restore and delete of a large run: time and the longest write lock (ROLLOUTS=100000).
ROLLOUTS ?= 100000
bench-archive: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_archive --db $(DB) --rollouts $(ROLLOUTS)
# 20 users browsing gunicorn during a 2,000-rollout qcluster run (DB=postgres: PostgreSQL + Redis at
# GYMWEB_REDIS_URL); BENCH_PORT picks gunicorn's port (default 9300).
bench-team: $(BIN)/.installed
	GYMWEB_ALLOW_LOCAL_TARGETS=1 $(BIN)/python -m benchmarks.bench_team --db $(DB)
# The fault runs of issue 28 on SQLite (gunicorn + qcluster): worker SIGKILL then SIGTERM, env
# restart, Redis cache down (its own redis-server on port 19579), hostile 200 MB replies, three
# concurrent uploads; keys, peak RSS and the longest page of each. FAULTS= picks some.
FAULTS ?= worker-stop,env-restart,redis-down,hostile,uploads
bench-faults: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_faults --only $(FAULTS)
# One large upload through the background task in a fresh process: seconds and peak RSS (ROWS_UPLOAD=).
ROWS_UPLOAD ?= 1000000
bench-upload: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_upload_rss --db $(DB) --rows $(ROWS_UPLOAD)
# One large rollouts import (ROWS_IMPORT=) while another process writes to the SQLite file every
# 50 ms: seconds, peak RSS and that writer's longest wait.
ROWS_IMPORT ?= 100000
bench-import: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_upload_rss --import --db $(DB) --rows $(ROWS_IMPORT)
# A worker's RSS before, during and after a spike of hostile 200 MB agent replies.
bench-reply-rss: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_reply_rss

# NeMo Gym 0.7.0 side by side with gymweb on the same work, in one run (issue 14). Needs NeMo Gym's
# venv, built by the peer scripts' setup.sh (never in .ci/run: it downloads 1.4 GB and starts Ray).
# make bench-vs-nemo [NGPEER_DIR=../shared/nemo_gym_peer] [NGPEER_WORK=/tmp/ngpeer] [ROWS=300 C=50 SLEEP_MS=200]
NGPEER_DIR ?= ../shared/nemo_gym_peer
NGPEER_WORK ?= $(or $(TMPDIR),/tmp)/ngpeer
ROWS ?= 300
C ?= 50
SLEEP_MS ?= 200
bench-vs-nemo: $(BIN)/.installed
	@if [ ! -x "$(NGPEER_WORK)/venv/bin/gym" ]; then \
	  echo "NeMo Gym's venv is not at $(NGPEER_WORK)/venv. Make it once (about 4 minutes, 1.4 GB; NeMo Gym 0.7.0 needs Python 3.13):"; \
	  echo "  NGPEER_WORK=$(NGPEER_WORK) NGPEER_PYTHON=/path/to/python3.13 bash $(NGPEER_DIR)/setup.sh"; \
	  echo "(pyenv: NGPEER_PYTHON=\$$(pyenv root)/versions/3.13.0/bin/python3; see $(NGPEER_DIR)/README.md), then run make bench-vs-nemo again."; \
	  exit 1; \
	fi
	NGPEER_WORK=$(NGPEER_WORK) GYMWEB_ALLOW_LOCAL_TARGETS=1 bash $(NGPEER_DIR)/sidebyside.sh $(CURDIR) $(CURDIR)/$(BIN)/python $(ROWS) $(C) $(SLEEP_MS)

# A training loop: 20 consecutive batches of 32 and of 512 rollouts, gymweb's client against NeMo Gym
# 0.7.0's run_examples batch by batch in one run (NeMo Gym's venv at NGPEER_VENV_DIR/venv; ports 20500-20510).
# make bench-trainer [NGPEER_VENV_DIR=$(NGPEER_WORK)] [DB=sqlite|postgres] [TRAINER_ARGS='--sizes 32 --batches 5']
NGPEER_VENV_DIR ?= $(NGPEER_WORK)
bench-trainer: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_trainer --db $(DB) --ngpeer $(NGPEER_VENV_DIR) $(TRAINER_ARGS)

# NeMo Gym 0.7.0 and gymweb at scale (issue 27): 2,000 and 10,000 rollouts all in flight, 30 s per agent
# call x 3 calls, side by side in one run (NeMo Gym's head server on 11000; agent/env ports 19301/19302).
# Where NeMo Gym's fixed ports are shared, run it as: flock /tmp/ngpeer.lock make bench-scale-vs-nemo
# make bench-scale-vs-nemo [NGPEER_VENV_DIR=$(NGPEER_WORK)] [SCALE_ARGS='--sizes 2000 --latency-ms 3000 --repeats 3']
bench-scale-vs-nemo: $(BIN)/.installed
	$(BIN)/python -m benchmarks.bench_scale_vs_nemo --db $(DB) --ngpeer $(NGPEER_VENV_DIR) $(SCALE_ARGS)

