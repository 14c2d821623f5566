#!/usr/bin/env bash
# The first-use path from the wheel, outside the checkout: build the wheel, check it carries every
# file of the gymweb and rollouts packages (and nothing else at top level), install it into a fresh
# virtual environment in a temporary folder, then from there: gymweb migrate, gymweb demo (a demo
# run to its end), gymweb serve (the sign-in page, its stylesheet, /healthz), gymweb collect
# against the example env and agent. SQLite and the ORM broker in a data directory of its own.
# Usage: bash scripts/wheel_check.sh   (PY=python3.11 to pick the interpreter; UV=path/to/uv)
# uv (a test dependency, in .venv after `make install`) builds and installs: pip took minutes here.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python3}
UV=${UV:-$repo/.venv/bin/uv}
command -v "$UV" >/dev/null || { echo "wheel_check: uv not found at $UV (make install brings it)"; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gymweb-wheel.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
  sleep 1
  rm -rf "$work"
}
trap cleanup EXIT
say() { echo "wheel_check [$(date +%H:%M:%S)]: $*"; }
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_http() {  # URL: wait up to 60 s for an answer
  for _ in $(seq 1 300); do curl -fsS -o /dev/null "$1" 2>/dev/null && return 0; sleep 0.2; done
  say "no answer from $1"; return 1
}

say "building the wheel"
"$UV" build --quiet --wheel --out-dir "$work/dist" "$repo"
wheel=$(ls "$work"/dist/gymweb-*.whl)
(cd "$repo" && git ls-files gymweb rollouts) > "$work/tracked.txt"
"$PY" - "$wheel" "$work/tracked.txt" <<'PYEOF'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
tracked = [line.strip() for line in open(sys.argv[2]) if line.strip()]
assert tracked, "git ls-files listed nothing"
missing = [t for t in tracked if t not in names]
tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
assert not missing, f"the wheel lacks {len(missing)} file(s): {missing[:10]}"
assert tops == {"gymweb", "rollouts"}, f"unexpected top-level entries in the wheel: {sorted(tops)}"
print(f"wheel_check: the wheel carries all {len(tracked)} files of gymweb/ and rollouts/")
PYEOF

say "installing it into a fresh virtual environment in $work"
"$UV" venv --quiet --python "$PY" "$work/venv"
"$UV" pip install --quiet --python "$work/venv/bin/python" "$wheel"
gymweb="$work/venv/bin/gymweb"

cd "$work"  # nothing below may need the checkout
unset DATABASE_URL GYMWEB_REDIS_URL GYMWEB_SQLITE_PATH GYMWEB_STATIC_ROOT GYMWEB_DEBUG GYMWEB_SECRET_KEY GYMWEB_CACHE_URL
export GYMWEB_DATA_DIR="$work/data" GYMWEB_Q_NAME="gymweb-wheel-check-$$" GYMWEB_Q_WORKERS=1 PYTHONUNBUFFERED=1
listing=$("$gymweb" --help)
grep -q "^  collect " <<<"$listing" || { say "gymweb --help does not list collect"; exit 1; }

say "gymweb migrate"
"$gymweb" migrate --verbosity 0

say "gymweb demo (a demo run to its end)"
web=$(free_port); envp=$(free_port); agentp=$(free_port)
timeout 300 "$gymweb" demo --port "$web" --env-port "$envp" --agent-port "$agentp" --num-repeats 1 --exit-when-done > "$work/demo.log" 2>&1 \
  || { cat "$work/demo.log"; exit 1; }
grep -q "demo run completed: 7 succeeded, 1 failed" "$work/demo.log" || { cat "$work/demo.log"; exit 1; }

say "gymweb serve (a page, its stylesheet, /healthz)"
export GYMWEB_SECRET_KEY="wheel-check-$(date +%s%N)-not-secret-but-long-enough-for-django"
port=$(free_port)
setsid "$gymweb" serve --bind "127.0.0.1:$port" --workers 1 > "$work/serve.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$port/healthz" || { cat "$work/serve.log"; exit 1; }
page=$(curl -fsS "http://127.0.0.1:$port/accounts/login/")
grep -q "Sign in" <<<"$page" || { say "the sign-in page does not say Sign in"; exit 1; }
css=$(grep -o '/static/gymweb/app\.[0-9a-f]*\.css' <<<"$page" | head -1)
[ -n "$css" ] && curl -fsS -o /dev/null "http://127.0.0.1:$port$css" || { say "the stylesheet ($css) is not served"; exit 1; }

say "gymweb collect against the example env and agent"
envp=$(free_port); agentp=$(free_port)
setsid "$work/venv/bin/python" -m gymweb.examples.counter_env --port "$envp" > "$work/env.log" 2>&1 & pids+=($!)
setsid "$work/venv/bin/python" -m gymweb.examples.counter_agent --port "$agentp" > "$work/agent.log" 2>&1 & pids+=($!)
wait_http "http://127.0.0.1:$envp/" || true
tasks=$("$work/venv/bin/python" -c 'import gymweb.examples, pathlib; print(pathlib.Path(gymweb.examples.__file__).parent / "data" / "counter_tasks.jsonl")')
for p in "$envp" "$agentp"; do for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break; sleep 0.1; done; done
GYMWEB_ALLOW_LOCAL_TARGETS=1 timeout 300 "$gymweb" collect --agent-url "http://127.0.0.1:$agentp" --env-url "http://127.0.0.1:$envp" \
  --input "$tasks" --output "$work/results/rollouts.jsonl" --no-progress > "$work/collect.log" 2>&1 || { cat "$work/collect.log"; exit 1; }
lines=$(wc -l < "$work/results/rollouts.jsonl")
[ "$lines" -eq 5 ] || { say "collect wrote $lines rows, not 5"; cat "$work/collect.log"; exit 1; }
say "ok: wheel built and installed outside the checkout; migrate, demo run, page, collect all work"
