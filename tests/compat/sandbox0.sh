#!/usr/bin/env bash
# Sandbox0's Python SDK, unchanged, against a real daemon: the programs in sandbox0/ (the
# Sandbox API reference's workflows and the SDK's documented calls, failures included) run
# as `belljar sandbox0 -- python3 PROGRAM.py`. belljard runs in a temporary BELLJAR_HOME
# (`--port 0`); every sandbox it made is deleted at the end.
#
# The pinned SDK is installed by name from PyPI into a venv at
# $BELLJAR_CACHE/compat-sandbox0-<hash of its version and python's version>, so a second run
# installs nothing (BELLJAR_COMPAT_SANDBOX0 names another directory).
#
# Needs: python3 with venv, scripts/setup.sh run (the base and python3.13 images).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
target="${CARGO_TARGET_DIR:-$BELLJAR_CACHE/cargo-target}"
say() { printf -- '--> %s\n' "$*" >&2; }

# The pinned SDK line.
sdk=sandbox0==0.10.4

(cd "$repo" && cargo build --quiet -p belljard -p belljar-cli -p belljar-agent --bins)

for image in base python3.13; do
  [ -e "$BELLJAR_CACHE/images/$image/current" ] ||
    { echo "the $image image is not built (guest-images/build-all.sh)" >&2; exit 1; }
done

key=$(printf '%s\n' "$sdk" "$(python3 --version)" | sha256sum | cut -c1-16)
venv="${BELLJAR_COMPAT_SANDBOX0:-$BELLJAR_CACHE/compat-sandbox0-$key}"
if [ ! -f "$venv/.installed" ]; then
  say "installing $sdk into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "$sdk"
  touch "$venv/.installed"
fi

say "starting belljard"
# shellcheck source=../../scripts/lib/daemon.sh
. "$repo/scripts/lib/daemon.sh"
daemon_start "$target/debug/belljar" belljar-sandbox0
belljar="$target/debug/belljar"

failed=()
ran=0
for f in "$here"/sandbox0/*.py; do
  name=$(basename "$f")
  say "$name"
  ran=$((ran + 1))
  status=0
  timeout 300 "$belljar" sandbox0 -- "$venv/bin/python" "$f" || status=$?
  [ "$status" = 0 ] || failed+=("$name: exit $status")
done

# The same variables through `eval "$(belljar sandbox0 env)"`.
say "env"
ran=$((ran + 1))
(eval "$("$belljar" sandbox0 env)" &&
  [ "$SANDBOX0_BASE_URL" = "http://127.0.0.1:$port/compat/sandbox0" ] &&
  [ "$SANDBOX0_TOKEN" = "$token" ]) || failed+=("env: wrong variables")

if [ "${#failed[@]}" != 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  tail -n 40 "$daemon_log" >&2
  exit 1
fi
say "$ran programs passed"
