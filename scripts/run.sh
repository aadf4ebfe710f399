#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh) and runs Belljar: the desktop app when there is a
# display, otherwise the daemon with its web UI, whose address it prints.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. "$here/scripts/env.sh"

"$here/scripts/setup.sh"

bin="$CARGO_TARGET_DIR/debug"
if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ] && [ -f src-tauri/Cargo.toml ]; then
  step "building and starting the desktop app"
  (cd ui && npm run tauri:build --silent)
  exec "$CARGO_TARGET_DIR/release/belljar-app"
fi

step "starting the daemon"
"$bin/belljar" daemon start
step "open this address in a browser within a minute (its token works once; \`belljar ui\` makes a new one):"
"$bin/belljar" ui --no-open
