# What the Python SDK suites (tests/compat/e2b.sh, sandbox0.sh, modal.sh) share; sourced, with
# `repo` set to the repository: the binaries, the images they need, a venv of the pinned SDK
# cached by its version, and the count of programs run and failed.
export BELLJAR_CACHE="${BELLJAR_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/belljar}"
target="${CARGO_TARGET_DIR:-$BELLJAR_CACHE/cargo-target}"
belljar="$target/debug/belljar"
say() { printf -- '--> %s\n' "$*" >&2; }

(cd "$repo" && cargo build --quiet -p belljard -p belljar-cli -p belljar-agent --bins)

# compat_images IMAGE...: fails unless each of Belljar's images is built.
compat_images() {
  local image
  for image in "$@"; do
    [ -e "$BELLJAR_CACHE/images/$image/current" ] ||
      { echo "the $image image is not built (guest-images/build-all.sh)" >&2; exit 1; }
  done
}

# compat_venv NAME SPEC [DIR]: sets `venv` to a venv holding the pip requirement SPEC, at DIR
# or at $BELLJAR_CACHE/compat-NAME-<hash of SPEC and python's version>, installed once.
compat_venv() {
  local key
  key=$(printf '%s\n' "$2" "$(python3 --version)" | sha256sum | cut -c1-16)
  venv="${3:-$BELLJAR_CACHE/compat-$1-$key}"
  if [ ! -f "$venv/.installed" ]; then
    say "installing $2 into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$2"
    touch "$venv/.installed"
  fi
}

failed=()
ran=0
# compat_run NAME DIR COMMAND...: runs COMMAND in DIR (at most 300 s), counted as NAME.
compat_run() {
  local name=$1 dir=$2 status=0
  shift 2
  say "$name"
  ran=$((ran + 1))
  (cd "$dir" && timeout 300 "$@") || status=$?
  [ "$status" = 0 ] || failed+=("$name: exit $status")
}

# compat_done: the failures and the daemon log's tail (exit 1), or how many passed.
compat_done() {
  if [ "${#failed[@]}" != 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}" >&2
    tail -n 40 "$daemon_log" >&2
    exit 1
  fi
  say "$ran programs passed"
}
