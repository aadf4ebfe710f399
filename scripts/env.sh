# Shared settings of the set-up, run and test scripts; sourced, not run.
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
# Cargo's build output lives in the cache too, so a fresh clone on the same machine rebuilds
# only what changed (cargo's own fingerprints decide).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$BELLJAR_CACHE/cargo-target}"
step() { printf '\n==> %s\n' "$*" >&2; }
