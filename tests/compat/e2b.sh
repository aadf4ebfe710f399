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
# shellcheck source=lib.sh
. "$here/lib.sh"

# The pinned SDKs.
sdk=2.63.0
sdk_npm=2.51.0

compat_images base
compat_venv e2b "e2b==$sdk" "${BELLJAR_COMPAT_E2B:-}"

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
daemon_start "$belljar" belljar-e2b

for f in "$here"/e2b/*.py; do
  compat_run "$(basename "$f")" "$home" "$belljar" e2b -- "$venv/bin/python" "$f"
done

for f in "$here"/e2b/*.mjs; do
  name=$(basename "$f")
  work=$(mktemp -d "$home/js.XXXXXX")
  ln -s "$npm_dir/node_modules" "$work/node_modules"
  cp "$f" "$work/"
  compat_run "$name" "$work" "$belljar" e2b -- node "$name"
done

# The same through `eval "$(belljar e2b env)"`.
compat_run "basics.py (env)" "$home" \
  sh -c 'eval "$("$1" e2b env)" && exec "$2" "$3"' sh "$belljar" "$venv/bin/python" "$here/e2b/basics.py"
compat_done
