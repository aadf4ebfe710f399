#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh) and runs every test: formatting and lints, the Rust
# workspace (unit, KVM tiny-guest, QEMU boot, namespace escape and end-to-end tests), the
# desktop app's own workspace (src-tauri) and the UI's type check, the API fuzzing, the SDKs,
# Vercel's, E2B's and Sandbox0's SDKs and Modal's client against the compatibility layers
# (tests/compat), the UI in a real browser and in the desktop app installed from its .deb,
# then real microVM sandboxes (scripts/test-microvm.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. "$here/scripts/env.sh"

# Root's suite, as CI runs it: some of its tests make accounts and network namespaces, switch
# uids or mount sized disks, and the v1 limits need root. Said here, not after half an hour of
# building; an ordinary user's run is the rootless job in L1 (below).
if [ "$(id -u)" -ne 0 ]; then
  echo "error: scripts/test.sh runs as root, as CI does (its tests make accounts and network namespaces, switch uids and mount disks); the ordinary user's tests run in the rootless job in L1 (README, Tests)" >&2
  exit 1
fi

"$here/scripts/setup.sh"

step "belljar on PATH, as README's commands use it"
# What a user's shell runs for a bare `belljar`: the link setup.sh made, not another one earlier
# on PATH.
hash -r
want="${BELLJAR_BIN_DIR:-/usr/local/bin}/belljar"
if [ "$(command -v belljar)" != "$want" ]; then
  echo "belljar on PATH is '$(command -v belljar)', not $want (PATH=$PATH)" >&2
  exit 1
fi
belljar --version
step "docs: every command, flag, path and link they show exists (scripts/check-docs.py)"; scripts/check-docs.py

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "cargo test --workspace"
cargo test --workspace --no-fail-fast 2>&1 | tee "$BELLJAR_CACHE/last-cargo-test.log"

# Its twin, as an ordinary user on delegated cgroup v2, runs in the microVM harness's L1 guest
# (tests/microvm/rootless.sh): the two hosts' findings must differ.
step "belljar doctor on this host (root, cgroup v1; tests/tests/doctor.rs)"
BELLJAR_DOCTOR_HOST=v1-root cargo test --quiet -p belljar-e2e --test doctor -- --ignored --exact doctor_as_root_on_cgroup_v1

# The desktop app is a workspace of its own (it builds against WebKitGTK), so the workspace
# steps above do not reach it. tauri-build wants the sidecar in place (the debug belljard
# built by setup.sh; copied only when it changed, so a warm run rebuilds nothing).
step "src-tauri: cargo fmt --check, clippy -D warnings, cargo test"
(cd ui && npm run --silent sidecar)
(
  cd src-tauri
  cargo fmt --check
  cargo clippy --all-targets --quiet -- -D warnings
  cargo test --quiet
)

step "UI type check (svelte-check)"
(cd ui && npm run --silent check -- --fail-on-warnings)

step "API fuzzing: schemathesis against a real daemon (bounded, tests/api-fuzz/run.sh)"
BELLJAR_FUZZ_SECONDS="${BELLJAR_FUZZ_SECONDS:-150}" timeout 300 tests/api-fuzz/run.sh

step "SDKs against a real daemon (sdk/run-tests.sh: TypeScript with the AI SDK adapter, Python)"
timeout 600 sdk/run-tests.sh

step "Vercel SDK compatibility: the real @vercel/sandbox 1.x and 3.x through belljar vercel (tests/compat/run.sh)"
timeout 600 tests/compat/run.sh

step "Sandbox0 SDK compatibility: the real sandbox0 Python SDK through belljar sandbox0 (tests/compat/sandbox0.sh)"
timeout 600 tests/compat/sandbox0.sh

step "E2B SDK compatibility: the real e2b Python SDK through belljar e2b (tests/compat/e2b.sh)"
timeout 600 tests/compat/e2b.sh

step "Modal client compatibility: the real modal Python client through belljar modal (tests/compat/modal.sh)"
timeout 600 tests/compat/modal.sh

if [ -x tests/ui/run.sh ]; then
  step "UI tests (Playwright in Chromium, WebDriver in the desktop app)"
  tests/ui/run.sh
fi

step "microVM tests (scripts/test-microvm.sh: nested KVM in a QEMU-TCG guest here)"
# Up to 8 L1 tries within 30 minutes: L1 crashes and hangs under TCG come in runs, most
# failed tries end within two minutes, and a new try runs only the tests no earlier one
# finished (README, microVM tests). With the rootless job's 15, CI's 90 minutes hold.
BELLJAR_MICROVM_TIMEOUT="${BELLJAR_MICROVM_TIMEOUT:-960}" BELLJAR_MICROVM_TRIES=8 \
  BELLJAR_MICROVM_BUDGET="${BELLJAR_MICROVM_BUDGET:-1800}" scripts/test-microvm.sh

# Always in L1 (--nested), even on a KVM host: the job remounts cgroups and binds over /etc.
step "rootless tests (tests/microvm/rootless.sh: an ordinary user on delegated cgroup v2, in L1)"
BELLJAR_MICROVM_JOB="$here/tests/microvm/rootless.sh" \
  BELLJAR_MICROVM_RUN="${BELLJAR_MICROVM_CACHE:-$BELLJAR_CACHE/microvm-harness}/run-rootless" \
  BELLJAR_MICROVM_TIMEOUT="${BELLJAR_ROOTLESS_TIMEOUT:-600}" BELLJAR_MICROVM_TRIES=8 \
  BELLJAR_MICROVM_BUDGET="${BELLJAR_ROOTLESS_BUDGET:-900}" scripts/test-microvm.sh --nested

