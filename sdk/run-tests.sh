#!/usr/bin/env bash
# The SDK suites against a real daemon: belljard (namespace backend, `--port 0`) in a temporary
# BELLJAR_HOME, which the SDKs find exactly as the CLI does; then the TypeScript SDK's tsc and
# Node tests (the AI SDK adapter through `generateText` among them) and the Python SDK's pytest
# (sync and asyncio clients, installed with `pip install ./sdk/python`, checked by mypy --strict).
#
# Installs what it needs by name, cached under $BELLJAR_CACHE keyed by its inputs:
# sdk/typescript/node_modules from its lock file, and a virtualenv $BELLJAR_CACHE/sdk-venv from
# sdk/python/pyproject.toml. Usage: sdk/run-tests.sh [typescript] [python] (default both).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
target="${CARGO_TARGET_DIR:-$BELLJAR_CACHE/cargo-target}"
suites=("$@")
[ ${#suites[@]} -gt 0 ] || suites=(typescript python)
say() { printf -- '--> %s\n' "$*" >&2; }

(cd "$repo" && cargo build --quiet -p belljard -p belljar-cli -p belljar-agent --bins)

for suite in "${suites[@]}"; do
  case "$suite" in
    typescript)
      stamp="$here/typescript/node_modules/.belljar-lock.sha256"
      if ! sha256sum "$here/typescript/package-lock.json" | cmp -s - "$stamp"; then
        say "npm ci in sdk/typescript"
        (cd "$here/typescript" && npm ci --no-audit --no-fund --loglevel=error)
        sha256sum "$here/typescript/package-lock.json" >"$stamp"
      fi
      ;;
    python)
      venv="$BELLJAR_CACHE/sdk-venv"
      key=$(cat "$here/python/pyproject.toml" "$here/python/requirements-test.txt" | sha256sum)
      if [ "$key" != "$(cat "$venv/.belljar-inputs.sha256" 2>/dev/null)" ]; then
        say "creating $venv"
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/python/requirements-test.txt"
        echo "$key" >"$venv/.belljar-inputs.sha256"
      fi
      # The package itself is reinstalled every run: its sources change without its inputs.
      "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall "$here/python"
      ;;
    *) echo "unknown suite $suite (typescript, python)" >&2; exit 2 ;;
  esac
done

say "starting belljard"
# shellcheck source=../scripts/lib/daemon.sh
. "$repo/scripts/lib/daemon.sh"
daemon_start "$target/debug/belljar" belljar-sdk

status=0
for suite in "${suites[@]}"; do
  case "$suite" in
    typescript)
      say "TypeScript SDK: tsc and node --test"
      (cd "$here/typescript" && npm test --silent) || status=1
      ;;
    python)
      say "Python SDK: mypy --strict, pytest"
      (cd "$here/python" && "$BELLJAR_CACHE/sdk-venv/bin/python" -m mypy --strict --cache-dir=/dev/null src/belljar) || status=1
      (cd "$here/python" && "$BELLJAR_CACHE/sdk-venv/bin/python" -m pytest -q -p no:cacheprovider tests) || status=1
      ;;
  esac
done
if [ "$status" -ne 0 ]; then
  say "an SDK suite failed; the daemon's log ends:"
  tail -30 "$daemon_log" >&2
fi
exit "$status"
