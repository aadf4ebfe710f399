#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh) and runs every test: formatting and lints, the Rust
# workspace (unit, KVM tiny-guest, QEMU boot, namespace escape and end-to-end tests), and the
# UI in a real browser and in the real desktop app, then real microVM sandboxes
# (scripts/test-microvm.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. "$here/scripts/env.sh"

"$here/scripts/setup.sh"

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "cargo test --workspace"
cargo test --workspace --no-fail-fast 2>&1 | tee "$BELLJAR_CACHE/last-cargo-test.log"

step "API fuzzing: schemathesis against a real daemon (bounded, tests/api-fuzz/run.sh)"
BELLJAR_FUZZ_SECONDS="${BELLJAR_FUZZ_SECONDS:-150}" timeout 300 tests/api-fuzz/run.sh

if [ -x tests/ui/run.sh ]; then
  step "UI tests (Playwright in Chromium, WebDriver in the desktop app)"
  tests/ui/run.sh
fi

step "microVM tests (scripts/test-microvm.sh: nested KVM in a QEMU-TCG guest here)"
BELLJAR_MICROVM_TIMEOUT="${BELLJAR_MICROVM_TIMEOUT:-720}" scripts/test-microvm.sh
