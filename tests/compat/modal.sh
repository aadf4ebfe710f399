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
# binaries, docker-registry, buildah and busybox-static for the registry image).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"

# The pinned client: the layer answers its minor series (crates/daemon/src/compat/modal).
compat_images base python3.13
compat_venv modal "modal==1.6.4" "${BELLJAR_COMPAT_MODAL:-}"

# A registry on loopback holding a small image (busybox-static), for `Image.from_registry`
# to pull: Debian's docker-registry, the image made with buildah, as tests/tests/e2e_oci.rs
# does. Both are killed and removed at exit.
for tool in docker-registry buildah busybox curl; do
  command -v "$tool" > /dev/null ||
    { echo "$tool is not installed: scripts/setup.sh installs it" >&2; exit 1; }
done
work=$(mktemp -d /tmp/belljar-modal-registry.XXXXXX)
registry_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf 'version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\n' \
  "$work/registry" "$registry_port" > "$work/registry.yml"
docker-registry serve "$work/registry.yml" > /dev/null 2>&1 &
registry_pid=$!
cleanup_registry() { kill "$registry_pid" 2> /dev/null; rm -rf "$work"; }
trap cleanup_registry EXIT
timeout 30 bash -c "until curl -sf http://127.0.0.1:$registry_port/v2/ > /dev/null; do sleep 0.1; done"
B="buildah --root $work/storage --runroot $work/run --storage-driver vfs"
c=$($B from scratch)
m=$($B mount "$c")
mkdir -p "$m/bin" "$m/etc"
cp "$(command -v busybox)" "$m/bin/busybox"
for a in sh cat echo pwd; do ln -s busybox "$m/bin/$a"; done
echo "from the registry" > "$m/etc/hello"
$B unmount "$c" > /dev/null
$B config --env PATH=/bin "$c"
$B commit -q "$c" modal-busy > /dev/null
$B push -q --tls-verify=false modal-busy "docker://127.0.0.1:$registry_port/modal/busy:1"
export BELLJAR_INSECURE_REGISTRIES="127.0.0.1:$registry_port"
export BELLJAR_TEST_REGISTRY="127.0.0.1:$registry_port"

say "starting belljard"
# shellcheck source=../../scripts/lib/daemon.sh
. "$repo/scripts/lib/daemon.sh"
daemon_start "$belljar" belljar-modal
trap 'daemon_stop; cleanup_registry' EXIT

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
