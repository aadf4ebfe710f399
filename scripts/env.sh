# Shared settings of the set-up, run and test scripts; sourced, not run.
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
# Cargo's build output lives in the cache too, so a fresh clone on the same machine rebuilds
# only what changed (cargo's own fingerprints decide).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$BELLJAR_CACHE/cargo-target}"
# These scripts build each change once, so cargo's incremental state (as large as the rest of
# the build) would only fill the disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# Keeps the cached build from growing without bound across many clones and toolchain updates:
# drops the incremental state these scripts never use and, above $BELLJAR_CARGO_CACHE_GIB
# (default 40 GiB: one full run of scripts/test.sh leaves ~25 GiB), the whole build, which the next step rebuilds from its sources.
trim_cargo_target() {
  [ -d "$CARGO_TARGET_DIR" ] || return 0
  if [ "$CARGO_INCREMENTAL" = 0 ]; then
    rm -rf "$CARGO_TARGET_DIR"/*/incremental "$CARGO_TARGET_DIR"/*/*/incremental
  fi
  local limit_gib="${BELLJAR_CARGO_CACHE_GIB:-40}" used_kib
  used_kib=$(du -sk "$CARGO_TARGET_DIR" | cut -f1)
  if [ "$used_kib" -gt $((limit_gib * 1024 * 1024)) ]; then
    step "the cached build in $CARGO_TARGET_DIR is $((used_kib / 1024 / 1024)) GiB, over ${limit_gib} GiB: starting it afresh"
    rm -rf "${CARGO_TARGET_DIR:?}"/*
  fi
}
step() { printf '\n==> %s\n' "$*" >&2; }
