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
# shellcheck source=lib.sh
. "$here/lib.sh"

compat_images base python3.13
compat_venv sandbox0 "sandbox0==0.10.4" "${BELLJAR_COMPAT_SANDBOX0:-}"

say "starting belljard"
# shellcheck source=../../scripts/lib/daemon.sh
. "$repo/scripts/lib/daemon.sh"
daemon_start "$belljar" belljar-sandbox0

for f in "$here"/sandbox0/*.py; do
  compat_run "$(basename "$f")" "$PWD" "$belljar" sandbox0 -- "$venv/bin/python" "$f"
done

# The same variables through `eval "$(belljar sandbox0 env)"`.
say "env"
ran=$((ran + 1))
(eval "$("$belljar" sandbox0 env)" &&
  [ "$SANDBOX0_BASE_URL" = "http://127.0.0.1:$port/compat/sandbox0" ] &&
  [ "$SANDBOX0_TOKEN" = "$token" ]) || failed+=("env: wrong variables")
compat_done
