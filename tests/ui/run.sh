#!/usr/bin/env bash
# Belljar's UI tests: the UI's unit tests, then builds what the others need (the web UI, belljard and the agent, the desktop
# app's .deb with its sidecar (scripts/app-deb.sh, cached by its inputs), tauri-driver), then
# runs the Playwright test in Debian's Chromium and the WebDriver tests of the app as users get
# it: the .deb unpacked into a clean prefix, started through its desktop entry under Xvfb, by
# the caller and (as root only) by an ordinary account the test makes.
# Exits non-zero on any failure; the last line is "N passed, M failed".
#
# Needs (Debian): chromium xvfb webkit2gtk-driver libwebkit2gtk-4.1-dev libgtk-3-dev
# libayatana-appindicator3-dev librsvg2-dev libsoup-3.0-dev libxdo-dev; the `base` image built
# under $BELLJAR_CACHE (scripts/setup.sh builds it). UI_TESTS=browser or UI_TESTS=app runs one.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target}"
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
which="${UI_TESTS:-browser app}"
say() { printf '\n--> %s\n' "$*" >&2; }
passed=0
failed=0

build() {
  set -e
  if [ ! -d "$repo/ui/node_modules" ]; then (cd "$repo/ui" && npm ci --no-audit --no-fund --loglevel=error); fi
  if [ ! -d "$here/node_modules" ]; then (cd "$here" && npm ci --no-audit --no-fund --loglevel=error); fi
  say "building the web UI"
  (cd "$repo/ui" && npm run --silent build)
  say "building belljard and the agent"
  (cd "$repo" && cargo build --quiet -p belljard -p belljar-agent --bins)
  if [ ! -e "$BELLJAR_CACHE/images/base/current" ]; then
    say "building the base image (guest-images/build-image.sh base)"
    "$repo/guest-images/build-image.sh" base
  fi
  if [[ " $which " == *" app "* ]]; then
    say "the desktop app's .deb (scripts/app-deb.sh: release app, UI embedded, belljard as its sidecar)"
    "$repo/scripts/app-deb.sh" >"$debfile"
    if ! command -v tauri-driver >/dev/null && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/tauri-driver" ]; then
      say "installing tauri-driver"
      cargo install --locked tauri-driver
    fi
  fi
  set +e
}

# Runs one test script; adds up its RESULT line (a crash without one counts as a failure).
run() {
  local out
  out=$(mktemp)
  "$@" 2>&1 | tee "$out"
  local line
  line=$(grep -E '^RESULT ' "$out" | tail -1)
  if [ -z "$line" ]; then
    failed=$((failed + 1))
  else
    passed=$((passed + $(sed -E 's/.*passed=([0-9]+).*/\1/' <<<"$line")))
    failed=$((failed + $(sed -E 's/.*failed=([0-9]+).*/\1/' <<<"$line")))
  fi
  rm -f "$out"
}

debfile=$(mktemp)
if ! (build); then
  rm -f "$debfile"
  echo "UI tests: the build failed" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

say "UI unit tests (node --test), and the test suite's own (tests/ui/unit)"
unit=$(cd "$repo/ui" && node --test tests/ "$here/unit/" 2>&1)
echo "$unit" | grep -E '^(not )?ok |^# (pass|fail)'
up=$(sed -nE 's/^# pass ([0-9]+)$/\1/p' <<<"$unit")
uf=$(sed -nE 's/^# fail ([0-9]+)$/\1/p' <<<"$unit")
passed=$((passed + ${up:-0}))
failed=$((failed + ${uf:-1}))

cd "$here"
if [[ " $which " == *" browser "* ]]; then
  say "Playwright: the web UI in Chromium against a real belljard"
  run node browser.test.mjs
fi
if [[ " $which " == *" app "* ]]; then
  say "WebDriver: the installed desktop app under Xvfb"
  # A clean prefix stands for the machine's root: the package's files land as dpkg would put
  # them, without touching the machine (the test checks the dependencies dpkg -x skips).
  export BELLJAR_APP_DEB BELLJAR_APP_PREFIX
  BELLJAR_APP_DEB=$(cat "$debfile")
  BELLJAR_APP_PREFIX=$(mktemp -d "${TMPDIR:-/tmp}/belljar-app-prefix.XXXXXX")
  dpkg -x "$BELLJAR_APP_DEB" "$BELLJAR_APP_PREFIX"
  # Our own X server on a free display (xvfb-run would also need xauth).
  n=99
  while [ -e "/tmp/.X$n-lock" ] || [ -e "/tmp/.X11-unix/X$n" ]; do n=$((n + 1)); done
  Xvfb ":$n" -screen 0 1440x900x24 -nolisten tcp >/dev/null 2>&1 &
  xvfb_pid=$!
  for _ in $(seq 50); do [ -e "/tmp/.X11-unix/X$n" ] && break; sleep 0.1; done
  DISPLAY=":$n" run node app.test.mjs
  # The same package run by an ordinary account (made and removed by the test, which needs root).
  if [ "$(id -u)" -eq 0 ]; then
    DISPLAY=":$n" run node app-user.test.mjs
  elif [ "${CI:-}" = true ]; then
    echo "  ✗ app as a user: needs root to make its account" >&2
    failed=$((failed + 1))
  else
    say "skipped: the app as an ordinary user (app-user.test.mjs) needs root to make its account"
  fi
  kill "$xvfb_pid" 2>/dev/null
  wait "$xvfb_pid" 2>/dev/null
  rm -rf "$BELLJAR_APP_PREFIX"
fi
rm -f "$debfile"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
