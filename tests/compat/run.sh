#!/usr/bin/env bash
# Vercel's Sandbox SDK, unchanged, against a real daemon: the examples of the SDK reference
# (v1/, with the pinned 1.x line; v3/, the same workflows with the pinned 3.x line, whose
# sandboxes have names) run as `belljar vercel -- node EXAMPLE.mjs`, and bad input through the
# layer gets error codes (bad-input.mjs). belljard runs on the namespace backend in a
# temporary BELLJAR_HOME (`--port 0`); every sandbox it made is deleted at the end.
#
# The SDKs are installed by name from the npm registry into
# $BELLJAR_CACHE/compat-npm-<hash of the pinned versions and node's version>, so a second run
# installs nothing (BELLJAR_COMPAT_NPM names another directory). Each example runs from a
# scratch directory whose node_modules links there; the preload `belljar vercel` writes goes to
# the temporary home.
#
# The examples use the runtimes as the reference writes them (node24, Vercel's default), plus
# python3.13 for a server behind a port.
#
# Needs: node and npm, scripts/setup.sh run (the node24 and python3.13 images, built binaries).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
target="${CARGO_TARGET_DIR:-$BELLJAR_CACHE/cargo-target}"
say() { printf -- '--> %s\n' "$*" >&2; }

# The pinned SDK lines.
sdk_v1=1.10.2
sdk_v3=3.5.0

(cd "$repo" && cargo build --quiet -p belljard -p belljar-cli -p belljar-agent --bins)

key=$(printf '%s\n' "@vercel/sandbox@$sdk_v1" "@vercel/sandbox@$sdk_v3" "$(node --version)" \
  | sha256sum | cut -c1-16)
npm_dir="${BELLJAR_COMPAT_NPM:-$BELLJAR_CACHE/compat-npm-$key}"
for line in v1 v3; do
  version=$sdk_v1
  [ "$line" = v3 ] && version=$sdk_v3
  dir="$npm_dir/$line"
  if [ ! -f "$dir/.installed" ]; then
    say "installing @vercel/sandbox@$version into $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    # A package.json of its own, so npm installs here and not in a parent directory's project.
    printf '{"name":"belljar-compat-%s","private":true}\n' "$line" >"$dir/package.json"
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "@vercel/sandbox@$version")
    touch "$dir/.installed"
  fi
done

say "starting belljard"
# shellcheck source=../../scripts/lib/daemon.sh
. "$repo/scripts/lib/daemon.sh"
daemon_start "$target/debug/belljar" belljar-compat

export BELLJAR_HOME="$home"
belljar="$target/debug/belljar"
# Examples that drive the daemon beside the SDK (pausing a sandbox) run this CLI.
export BELLJAR_CLI="$belljar"
failed=()
ran=0

# Runs one example with one SDK line; `env` runs it after `eval "$(belljar vercel env)"`
# instead of through `belljar vercel --`.
run() {
  local line=$1 file=$2 how=${3:-exec}
  local work
  work=$(mktemp -d "$home/example.XXXXXX")
  ln -s "$npm_dir/$line/node_modules" "$work/node_modules"
  cp "$file" "$work/"
  local name="$line/$(basename "$file") ($how)"
  say "$name"
  ran=$((ran + 1))
  local status=0
  if [ "$how" = env ]; then
    (cd "$work" && eval "$(BELLJAR_CACHE="$home/cache" "$belljar" vercel env)" &&
      timeout 300 node "$(basename "$file")") || status=$?
  else
    (cd "$work" && BELLJAR_CACHE="$home/cache" timeout 300 "$belljar" vercel -- node "$(basename "$file")") ||
      status=$?
  fi
  if [ "$status" != 0 ]; then
    failed+=("$name: exit $status")
  fi
}

for image in node24 python3.13; do
  [ -e "$BELLJAR_CACHE/images/$image/current" ] ||
    { echo "the $image image is not built (guest-images/build-all.sh)" >&2; exit 1; }
done

for f in "$here"/v1/*.mjs; do
  run v1 "$f"
done
for f in "$here"/v3/*.mjs; do
  run v3 "$f"
done
run v1 "$here/bad-input.mjs"
run v3 "$here/v3/basic-workflow.mjs" env

if [ "${#failed[@]}" != 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  tail -n 40 "$daemon_log" >&2
  exit 1
fi
say "$ran examples passed"
