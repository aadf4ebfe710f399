#!/usr/bin/env bash
# Schemathesis against a real daemon: belljard on the namespace backend in a temporary
# BELLJAR_HOME (`--port 0`), with one running sandbox (and a second for stop and delete) so
# that sandbox routes reach real code, fuzzed from its own /v1/openapi.json with the bearer
# token. Fails on any 5xx, any answer that breaks its documented schema, and any answer slower
# than the limit (a hang). Bounded in time: BELLJAR_FUZZ_SECONDS (default 150).
#
# Excluded, because their answers never end by design: GET /v1/events and
# GET .../files/watch (streams that stay open), GET .../terminal (a WebSocket), and
# POST /v1/images/{name}/build (builds a guest image for minutes).
#
# Needs: scripts/setup.sh run (schemathesis in $BELLJAR_CACHE/venv, the `base` image, built
# binaries).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
target="${CARGO_TARGET_DIR:-$BELLJAR_CACHE/cargo-target}"
seconds="${BELLJAR_FUZZ_SECONDS:-150}"
schemathesis="${BELLJAR_VENV:-$BELLJAR_CACHE/venv}/bin/schemathesis"
say() { printf -- '--> %s\n' "$*" >&2; }

[ -x "$schemathesis" ] || { echo "no $schemathesis: run scripts/setup.sh" >&2; exit 1; }
(cd "$repo" && cargo build --quiet -p belljard -p belljar-cli -p belljar-agent --bins)

say "starting belljard"
# shellcheck source=../../scripts/lib/daemon.sh
. "$repo/scripts/lib/daemon.sh"
daemon_start "$target/debug/belljar" belljar-api-fuzz

create() {
  api -X POST http://belljard/v1/sandboxes -d '{"backend":"namespace","timeout_ms":900000}' \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])'
}
BELLJAR_FUZZ_SANDBOX=$(create)
BELLJAR_FUZZ_VICTIM=$(create)
# A command that has exited: its logs and waits answer at once, and kill, stdin and resize
# reach their checks.
BELLJAR_FUZZ_COMMAND=$(api -X POST "http://belljard/v1/sandboxes/$BELLJAR_FUZZ_SANDBOX/commands" \
  -d '{"argv":["echo","hello"]}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
export BELLJAR_FUZZ_SANDBOX BELLJAR_FUZZ_VICTIM BELLJAR_FUZZ_COMMAND
say "sandboxes $BELLJAR_FUZZ_SANDBOX and $BELLJAR_FUZZ_VICTIM; fuzzing for at most ${seconds}s"

status=0
export SCHEMATHESIS_HOOKS=hooks
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
# Its cache of failures stays in the temporary home, not in the repository.
cd "$home"
# One worker: schemathesis's workers are threads, and this Python (3.11) raises "AST
# constructor recursion depth mismatch" when two threads parse lambdas' source at once (CPython
# gh-106905, fixed in 3.12), which failed a CI run with a runtime error in hypothesis itself.
"$schemathesis" --config-file "$here/schemathesis.toml" run \
  "http://127.0.0.1:$port/v1/openapi.json" \
  --header "Authorization: Bearer $token" \
  --checks not_a_server_error,response_schema_conformance \
  --max-response-time 10 \
  --request-timeout 30 \
  --phases examples,coverage,fuzzing \
  --max-examples "${BELLJAR_FUZZ_EXAMPLES:-25}" \
  --max-time "$seconds" \
  --workers 1 \
  --seed "${BELLJAR_FUZZ_SEED:-7423}" \
  --generation-database none \
  --exclude-operation-id events \
  --exclude-operation-id file_watch \
  --exclude-operation-id terminal \
  --exclude-operation-id image_build \
  --no-color || status=$?
if [ "$status" -ne 0 ]; then
  say "schemathesis failed ($status); the daemon's log ends:"
  tail -40 "$daemon_log" >&2
fi
exit "$status"
