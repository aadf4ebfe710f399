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
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
target="${CARGO_TARGET_DIR:-$BELLJAR_CACHE/cargo-target}"
say() { printf -- '--> %s\n' "$*" >&2; }

# The pinned client: the layer answers its minor series (crates/daemon/src/compat/modal).
client=1.6.4

(cd "$repo" && cargo build --quiet -p belljard -p belljar-cli -p belljar-agent --bins)

for image in base python3.13; do
  [ -e "$BELLJAR_CACHE/images/$image/current" ] ||
    { echo "the $image image is not built (guest-images/build-all.sh)" >&2; exit 1; }
done

key=$(printf '%s\n' "modal==$client" "$(python3 --version)" | sha256sum | cut -c1-16)
venv="${BELLJAR_COMPAT_MODAL:-$BELLJAR_CACHE/compat-modal-$key}"
if [ ! -f "$venv/.installed" ]; then
  say "installing modal==$client into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "modal==$client"
  touch "$venv/.installed"
fi

say "starting belljard"
# shellcheck source=../../scripts/lib/daemon.sh
. "$repo/scripts/lib/daemon.sh"
daemon_start "$target/debug/belljar" belljar-modal

belljar="$target/debug/belljar"
export BELLJAR_BIN="$belljar"
# The client reads ~/.modal.toml too: an empty home keeps a developer's own profile out.
export HOME="$home"
failed=()
ran=0
for f in "$here"/modal/*.py; do
  name=$(basename "$f")
  say "$name"
  ran=$((ran + 1))
  status=0
  (cd "$home" && timeout 300 "$belljar" modal -- "$venv/bin/python" "$f") || status=$?
  [ "$status" = 0 ] || failed+=("$name: exit $status")
done

# The same through `eval "$(belljar modal env)"`.
say "hello.py (env)"
ran=$((ran + 1))
status=0
(cd "$home" && eval "$("$belljar" modal env)" && timeout 300 "$venv/bin/python" "$here/modal/hello.py") ||
  status=$?
[ "$status" = 0 ] || failed+=("hello.py (env): exit $status")

if [ "${#failed[@]}" != 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  tail -n 40 "$daemon_log" >&2
  exit 1
fi
say "$ran programs passed"
