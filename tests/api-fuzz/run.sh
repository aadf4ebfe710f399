#!/usr/bin/env bash
# Schemathesis against a real daemon: belljard on the namespace backend in a temporary
# BELLJAR_HOME (`--port 0`), fuzzed from its own /v1/openapi.json with the bearer token. Every
# request is pointed at real resources (hooks.py: a running sandbox and a command of it, a
# sandbox of their own for the operations that end one, snapshots, a port, a mount; replaced
# when the fuzzer ends them), so that every operation reaches real code. Fails on any 5xx, any
# answer that breaks its documented schema, any answer slower than the limit (a hang), and any
# operation whose valid requests never got past a 404 (the table of answers per operation is
# printed at the end). Bounded in time: BELLJAR_FUZZ_SECONDS (default 150).
#
# Excluded, because their answers never end by design: GET /v1/events and
# GET .../files/watch (streams that stay open), GET .../terminal (a WebSocket), and
# POST /v1/images/{name}/build (builds a guest image for minutes). And POST /v1/images/prune:
# the image store is the user's cache, shared by every daemon of the user, and a prune would
# remove its images (`tests/tests/e2e_build.rs` tests it).
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

# Pulls reach no registry but a loopback port nothing listens on: a fuzzed reference naming
# any other registry is refused (registry_denied) before a connection is made.
export BELLJAR_ALLOWED_REGISTRIES=127.0.0.1:9
say "starting belljard"
# shellcheck source=../../scripts/lib/daemon.sh
. "$repo/scripts/lib/daemon.sh"
daemon_start "$target/debug/belljar" belljar-api-fuzz

# hooks.py makes the sandboxes, snapshots, command, port and mount the requests are pointed at,
# over the same TCP port and token as the fuzzer, and replaces those the fuzzer ends.
export BELLJAR_FUZZ_URL="http://127.0.0.1:$port" BELLJAR_FUZZ_TOKEN="$token"
# The excluded operations, for schemathesis's arguments and for the hooks' coverage table.
export BELLJAR_FUZZ_EXCLUDED="events file_watch terminal image_build images_prune"
excluded=()
for op in $BELLJAR_FUZZ_EXCLUDED; do excluded+=(--exclude-operation-id "$op"); done
say "fuzzing for at most ${seconds}s"

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
  "${excluded[@]}" \
  --no-color || status=$?
if [ "$status" -ne 0 ]; then
  say "schemathesis failed ($status); the daemon's log ends:"
  tail -40 "$daemon_log" >&2
fi
exit "$status"
