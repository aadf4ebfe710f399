#!/usr/bin/env bash
# The microVM job of scripts/test-microvm.sh: the VMM's `--ignored` Linux boot tests and the
# daemon end to end on `--backend microvm`. It runs where /dev/kvm works: inside the L1 guest
# (chrooted into the host's read-only root) or directly on a host with hardware KVM.
#
# Input (environment): BELLJAR_JOB_BIN (the cargo target's binary dir, with belljard, belljar,
# belljar-vmm, belljar-agent), BELLJAR_JOB_TESTS (colon-separated test executables),
# BELLJAR_CACHE, BELLJAR_KERNEL, BELLJAR_RESULTS (a writable directory), BELLJAR_MICROVM_FILTER
# (optional: only the tests whose names contain it). Output: the tests'
# output on stdout; `summary` (one line with passed/failed counts) and `status` in
# BELLJAR_RESULTS, and `progress` there, which a later run of the job (after L1 crashed) reads
# to run only the tests not yet finished (tests/microvm/progress.sh). Exit status 0 only when
# every test passed and at least one ran.
set -uo pipefail
: "${BELLJAR_JOB_BIN:?}" "${BELLJAR_JOB_TESTS:?}" "${BELLJAR_RESULTS:?}" "${BELLJAR_KERNEL:?}"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
start=$(now)

# Run from tmpfs, not 9p: timing-sensitive tests misbehave when every exec pages over 9p.
# The e2e tests find the daemon and CLI next to themselves (`<bin>/deps/<test>`).
work=$(mktemp -d /tmp/belljar-microvm-job.XXXXXX)
mkdir -p "$work/bin/deps"
for b in belljard belljar belljar-vmm belljar-agent; do
  cp "$BELLJAR_JOB_BIN/$b" "$work/bin/$b"
done
IFS=: read -r -a tests <<< "$BELLJAR_JOB_TESTS"
for t in "${tests[@]}"; do cp "$t" "$work/bin/deps/"; done
echo "job: binaries copied to tmpfs in $(since "$start")s"

# The daemons' homes go on ext4 when /tmp is a tmpfs (as in L1): snapshot layers keep
# overlayfs's `user.overlay.*` attributes, which tmpfs refuses before Linux 6.6 (L1 runs 6.1).
# A short mount point keeps the sandboxes' socket paths within the 108 bytes Unix allows.
data_fs=""
if [ "$(id -u)" = 0 ] && [ "$(stat -f -c %T /tmp)" = tmpfs ]; then
  truncate -s 2G "$work/data.ext4" && mkfs.ext4 -q -F "$work/data.ext4" &&
    mkdir -p /tmp/bjd && mount -o loop "$work/data.ext4" /tmp/bjd && data_fs=/tmp/bjd &&
    export TMPDIR=/tmp/bjd
  echo "job: daemon homes on ${data_fs:-tmpfs (no ext4 for them)}"
fi

# L1's init brings up no interface, not even loopback: every connection to 127.0.0.1 (a port
# forwarded to a microVM, as e2e_microvm's network check makes) would fail with "network is
# unreachable" before it reached the daemon. A desktop's loopback is up; so is a direct run's.
# e2e_microvm also has a microVM reach a server on the host, at an address that is not
# loopback (a guest's 127.0.0.1 is its own): L1 has no other, so its loopback gets one from
# the documentation range.
if [ -n "${BELLJAR_IN_L1:-}" ]; then
  ip link set lo up || echo "job: cannot bring up lo: connections to 127.0.0.1 will fail"
  ip addr add 192.0.2.1/32 dev lo || echo "job: cannot add 192.0.2.1 to lo"
fi

export BELLJAR_VMM="$work/bin/belljar-vmm"
# In L1, each VMM goes on its own L1 CPU, round robin (BELLJAR_L1_PIN=0: wherever L1's
# scheduler puts it). QEMU-TCG keeps one software TLB per L1 vCPU, not tagged by the L2
# guest's ASID: a nested guest that starts on a vCPU where another ran is one suspect of the
# early triple faults seen only with two guests at once. On hardware this wrapper is unused.
if [ -n "${BELLJAR_IN_L1:-}" ] && [ "${BELLJAR_L1_PIN:-1}" != 0 ] && command -v taskset > /dev/null; then
  printf '%s\n' '#!/bin/bash' \
    "n=\$(flock '$work/pin.lock' bash -c 'n=\$(cat $work/pin 2> /dev/null || echo 0); echo \$((n + 1)) > $work/pin; echo \$n')" \
    "exec taskset -c \$((n % \$(nproc))) '$work/bin/belljar-vmm' \"\$@\"" > "$work/bin/belljar-vmm-pinned"
  chmod +x "$work/bin/belljar-vmm-pinned"
  export BELLJAR_VMM="$work/bin/belljar-vmm-pinned"
  echo "job: each VMM pinned to one L1 CPU, round robin"
fi
export BELLJAR_BOOT_TIMEOUT="${BELLJAR_BOOT_TIMEOUT:-120}"
# Nested KVM fails the daemon's speed probe; the e2e tests ask for `--backend microvm`
# explicitly, which this lets through (`auto` is unaffected). Harmless on hardware KVM.
export BELLJAR_TESTING_FORCE_MICROVM=1
# A microVM on nested KVM under TCG boots in 15-60 s, not in well under a second.
export BELLJAR_READY_TIMEOUT="${BELLJAR_READY_TIMEOUT:-180s}"
export RUST_BACKTRACE=1

# BELLJAR_KVM_TRACE=1: L1's KVM records every exit and injected exception of its guests in
# the trace ring (the last ~15 MiB), saved to the results after a failed run: what a guest
# did before it triple-faulted or stalled (the VMM sees only KVM_EXIT_SHUTDOWN, with the
# registers already reset).
kvm_trace=""
if [ -n "${BELLJAR_KVM_TRACE:-}" ]; then
  kvm_trace=/sys/kernel/tracing
  [ -e "$kvm_trace/trace" ] || mount -t tracefs tracefs "$kvm_trace" || kvm_trace=""
  if [ -n "$kvm_trace" ]; then
    echo 8192 > "$kvm_trace/buffer_size_kb"
    for e in kvm_exit kvm_inj_exception kvm_page_fault kvm_pio kvm_mmio kvm_userspace_exit; do
      echo 1 > "$kvm_trace/events/kvm/$e/enable" || echo "job: no trace event kvm:$e"
    done
    # The ring stops at a guest's triple fault (SVM's shutdown exit, 0x7f; VMX's, 2), so what
    # the saved tail shows is what led to it, not what other guests did afterwards.
    echo 'traceoff if exit_reason == 127 || exit_reason == 2' > "$kvm_trace/events/kvm/kvm_exit/trigger" ||
      echo "job: no traceoff trigger on kvm:kvm_exit"
    echo "job: tracing L1's KVM events"
  else
    echo "job: no tracefs: BELLJAR_KVM_TRACE ignored"
  fi
fi

# L1 moves guest memory under its KVM when it compacts or migrates pages; each test's line
# says how many pages moved while it ran (`pgmigrate_success`), so a guest's triple fault can
# be set beside the page moves of its time. BELLJAR_L1_COMPACTION=0 turns L1's proactive
# compaction off (`vm.compaction_proactiveness`) and keeps it from moving locked pages.
migrated() { awk '$1 == "pgmigrate_success" { print $2 }' /proc/vmstat 2> /dev/null; }
if [ -n "${BELLJAR_IN_L1:-}" ] && [ "${BELLJAR_L1_COMPACTION:-}" = 0 ]; then
  { echo 0 > /proc/sys/vm/compaction_proactiveness && echo 0 > /proc/sys/vm/compact_unevictable_allowed &&
    echo "job: L1's proactive compaction is off"; } || echo "job: cannot turn L1's compaction off"
fi

# Runs one test executable in its own process group (killed afterwards: a VMM a failed test
# left running must neither keep the output open nor the next run waiting); extra arguments
# go to the test harness. Sets rc.
run_tests() {
  local exe=$1 out=$2 pid tailer watcher moved
  shift 2
  : > "$out"
  moved=$(migrated)
  [ -z "$kvm_trace" ] || { : > "$kvm_trace/trace"; echo 1 > "$kvm_trace/tracing_on"; }
  setsid "$exe" --ignored --test-threads=1 --nocapture "$@" > "$out" 2>&1 &
  pid=$!
  tail -n +1 -f --pid="$pid" "$out" &
  tailer=$!
  # A test that goes quiet gets a report of what its microVMs and daemon are doing.
  bash "$(dirname "$0")/stall-watch.sh" "$out" "${TMPDIR:-/tmp}" "$BELLJAR_STALL_QUIET" &
  watcher=$!
  rc=0
  wait "$pid" || rc=$?
  kill -KILL -- "-$pid" 2> /dev/null || true
  kill "$watcher" 2> /dev/null || true
  wait "$tailer" "$watcher" 2> /dev/null || true
  [ -z "$moved" ] || echo "job: pages L1 migrated during $*: $(($(migrated) - moved))"
  if [ -n "$kvm_trace" ] && [ "$rc" != 0 ]; then
    local saved
    saved="$BELLJAR_RESULTS/kvm-trace-$(basename "$out" .out)-$(date +%s).txt"
    tail -n 30000 "$kvm_trace/trace" > "$saved"
    echo "job: the KVM trace's last events are in $saved"
  fi
}

. "$(dirname "$0")/progress.sh"
for t in "${tests[@]}"; do
  exe="$work/bin/deps/$(basename "$t")"
  name=$(basename "$t" | sed 's/-[0-9a-f]*$//')
  t0=$(now)
  echo "job: ==> $name"
  # Each test runs alone (tests/microvm/progress.sh). The kvm group member's test is the
  # rootless job's (tests/microvm/rootless.sh).
  # shellcheck disable=SC2086 # an empty filter is no argument
  names=$("$exe" --ignored --list --skip a_kvm_group_member_creates_execs_and_deletes \
    ${BELLJAR_MICROVM_FILTER:-} 2> /dev/null | sed -n 's/: test$//p')
  if [ -z "$names" ] && [ -z "${BELLJAR_MICROVM_FILTER:-}" ]; then
    echo "job: $name lists no tests"
    progress_record "$name::--list" failed
  fi
  for test in $names; do
    progress_run run_tests "$exe" "$name::$test" "$test" "$work/$name.out"
  done
  echo "job: $name: $(wc -w <<< "$names") tests in $(since "$t0")s"
done
status=0
progress_status || status=1
summary="microvm job: $(progress_counts) in $(since "$start")s"
echo "$summary"
echo "$summary" > "$BELLJAR_RESULTS/summary"
echo "$status" > "$BELLJAR_RESULTS/status"
[ -z "$data_fs" ] || umount "$data_fs"
rm -rf "$work"
exit "$status"
