#!/usr/bin/env bash
# E2B's Python SDK, unchanged, against a real daemon: programs written from the SDK's README
# and docstrings (tests/compat/e2b/*.py), the failures included, each run as
# `belljar e2b -- python3 PROGRAM.py` and asserting what it got. belljard runs on the
# namespace backend in a temporary BELLJAR_HOME (`--port 0`); every sandbox it made is deleted
# at the end.
#
# The SDK is installed by name from PyPI into a venv at
# $BELLJAR_CACHE/compat-e2b-<hash of the pinned version and python's version>, so a second run
# installs nothing (BELLJAR_COMPAT_E2B names another directory).
#
# Needs: python3 with venv, scripts/setup.sh run (the base image, built binaries).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
target="${CARGO_TARGET_DIR:-$BELLJAR_CACHE/cargo-target}"
say() { printf -- '--> %s\n' "$*" >&2; }

# The pinned SDK.
sdk=2.63.0

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
