#!/usr/bin/env bash
# Modal's Python client, unchanged, against a real daemon: the Modal document's own Sandbox
# examples and programs written from its reference (tests/compat/modal/*.py), the failures
# included, each run as `belljar modal -- python3 PROGRAM.py` and asserting what it got.
# belljard runs on the namespace backend in a temporary BELLJAR_HOME (`--port 0`; its Modal
# layer is always on a free port); every sandbox it made is deleted at the end.
#
# The client is installed by name from PyPI into a venv at
# $BELLJAR_CACHE/compat-modal-<hash of the pinned version and python's version>, so a second
# run installs nothing (BELLJAR_COMPAT_MODAL names another directory).
#
# Needs: python3 with venv, scripts/setup.sh run (the base and python3.13 images, built
# binaries).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

# The pinned client: the layer answers its minor series (crates/daemon/src/compat/modal).
compat_images base python3.13
compat_venv modal "modal==1.6.4" "${BELLJAR_COMPAT_MODAL:-}"

say "starting belljard"
# shellcheck source=../../scripts/lib/daemon.sh
. "$repo/scripts/lib/daemon.sh"
daemon_start "$belljar" belljar-modal

export BELLJAR_BIN="$belljar"
# The client reads ~/.modal.toml too: an empty home keeps a developer's own profile out.
export HOME="$home"
for f in "$here"/modal/*.py; do
  compat_run "$(basename "$f")" "$home" "$belljar" modal -- "$venv/bin/python" "$f"
done
# The same through `eval "$(belljar modal env)"`.
compat_run "hello.py (env)" "$home" \
  sh -c 'eval "$("$1" modal env)" && exec "$2" "$3"' sh "$belljar" "$venv/bin/python" "$here/modal/hello.py"
compat_done
