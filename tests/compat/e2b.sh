#!/usr/bin/env bash
# E2B's SDKs, unchanged, against a real daemon: programs written from the Python SDK's README
# and docstrings (tests/compat/e2b/*.py), the failures included, each run as
# `belljar e2b -- python3 PROGRAM.py` and asserting what it got, and the same first steps with
# the JavaScript SDK (tests/compat/e2b/*.mjs, `belljar e2b -- node PROGRAM.mjs`). belljard runs on the
# namespace backend in a temporary BELLJAR_HOME (`--port 0`); every sandbox it made is deleted
# at the end.
#
# The SDKs are installed by name: from PyPI into a venv at
# $BELLJAR_CACHE/compat-e2b-<hash of the pinned version and python's version>, from npm into
# $BELLJAR_CACHE/compat-e2b-npm-<hash of the pinned version and node's version>, so a second
# run installs nothing (BELLJAR_COMPAT_E2B and BELLJAR_COMPAT_E2B_NPM name other directories).
#
# Needs: python3 with venv, node and npm, scripts/setup.sh run (the base image, built
# binaries).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
target="${CARGO_TARGET_DIR:-$BELLJAR_CACHE/cargo-target}"
say() { printf -- '--> %s\n' "$*" >&2; }

# The pinned SDKs.
sdk=2.63.0
sdk_npm=2.51.0

(cd "$repo" && cargo build --quiet -p belljard -p belljar-cli -p belljar-agent --bins)

[ -e "$BELLJAR_CACHE/images/base/current" ] ||
  { echo "the base image is not built (guest-images/build-all.sh)" >&2; exit 1; }

key=$(printf '%s\n' "e2b==$sdk" "$(python3 --version)" | sha256sum | cut -c1-16)
venv="${BELLJAR_COMPAT_E2B:-$BELLJAR_CACHE/compat-e2b-$key}"
if [ ! -f "$venv/.installed" ]; then
  say "installing e2b==$sdk into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "e2b==$sdk"
  touch "$venv/.installed"
fi

key=$(printf '%s\n' "e2b@$sdk_npm" "$(node --version)" | sha256sum | cut -c1-16)
npm_dir="${BELLJAR_COMPAT_E2B_NPM:-$BELLJAR_CACHE/compat-e2b-npm-$key}"
if [ ! -f "$npm_dir/.installed" ]; then
  say "installing e2b@$sdk_npm into $npm_dir"
  rm -rf "$npm_dir"
  mkdir -p "$npm_dir"
  # A package.json of its own, so npm installs here and not in a parent directory's project.
  printf '{"name":"belljar-compat-e2b","private":true}\n' >"$npm_dir/package.json"
  (cd "$npm_dir" && npm install --no-audit --no-fund --loglevel=error "e2b@$sdk_npm")
  touch "$npm_dir/.installed"
fi

say "starting belljard"
# shellcheck source=../../scripts/lib/daemon.sh
. "$repo/scripts/lib/daemon.sh"
daemon_start "$target/debug/belljar" belljar-e2b

belljar="$target/debug/belljar"
failed=()
ran=0
for f in "$here"/e2b/*.py; do
  name=$(basename "$f")
  say "$name"
  ran=$((ran + 1))
  status=0
  (cd "$home" && timeout 300 "$belljar" e2b -- "$venv/bin/python" "$f") || status=$?
  [ "$status" = 0 ] || failed+=("$name: exit $status")
done

for f in "$here"/e2b/*.mjs; do
  name=$(basename "$f")
  say "$name"
  ran=$((ran + 1))
  work=$(mktemp -d "$home/js.XXXXXX")
  ln -s "$npm_dir/node_modules" "$work/node_modules"
  cp "$f" "$work/"
  status=0
  (cd "$work" && timeout 300 "$belljar" e2b -- node "$name") || status=$?
  [ "$status" = 0 ] || failed+=("$name: exit $status")
done

# The same through `eval "$(belljar e2b env)"`.
say "basics.py (env)"
ran=$((ran + 1))
status=0
(cd "$home" && eval "$("$belljar" e2b env)" && timeout 300 "$venv/bin/python" "$here/e2b/basics.py") ||
  status=$?
[ "$status" = 0 ] || failed+=("basics.py (env): exit $status")

if [ "${#failed[@]}" != 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  tail -n 40 "$daemon_log" >&2
  exit 1
fi
say "$ran programs passed"
