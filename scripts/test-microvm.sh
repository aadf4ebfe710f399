#!/usr/bin/env bash
# Runs real microVM sandboxes: the VMM's `--ignored` Linux boot tests and the daemon end to
# end on `--backend microvm` (tests/microvm/job.sh).
#
# On a host whose /dev/kvm is hardware-backed the job runs directly. Elsewhere (no KVM, or the
# software PVM flavour, as on our build machines) it runs inside an L1 guest under QEMU TCG
# with emulated AMD SVM, whose kernel gives it a working nested /dev/kvm: Debian's stock
# kernel, a busybox initramfs with the KVM and 9p modules (tests/microvm/l1-init.sh), the
# host's root shared read-only over 9p and chrooted into, so the project's own binaries,
# guest kernel and images run unchanged. Results come back over a second, writable 9p share.
#
# Usage: scripts/test-microvm.sh [--nested|--direct] [--stress]
# --stress runs only the stress test (tests/tests/e2e_microvm_stress.rs) at full length: 200
# create/exec/round-trip/delete cycles, 4 in flight (BELLJAR_STRESS_* override each setting);
# without it the job runs every other microVM test.
# Environment: BELLJAR_MICROVM_TIMEOUT (seconds for the whole L1 run, default 900),
# BELLJAR_MICROVM_TRIES (L1 tries when one crashes or hangs, default 3 with QEMU 10) and
# BELLJAR_MICROVM_BUDGET (seconds for all tries, default tries x timeout; a try gets what is
# left of it, and starts only while BELLJAR_MICROVM_MIN_TRY seconds, default 240, are left),
# BELLJAR_MICROVM_REFRESH=1 (look for newer QEMU/kernel packages), BELLJAR_MICROVM_JOB (another
# job script with job.sh's inputs and outputs, e.g. a stress loop), BELLJAR_MICROVM_RUN (the
# run directory, default $BELLJAR_MICROVM_CACHE/run: give concurrent runs their own),
# BELLJAR_MICROVM_HANG (seconds without any QEMU CPU time after which an L1 try counts as hung
# and is retried, default 120),
# BELLJAR_L1_COMPACTION=0 (L1 compacts no memory proactively, see tests/microvm/job.sh),
# BELLJAR_L1_PIN=0 (L1 does not pin each VMM to one of its CPUs),
# BELLJAR_MICROVM_FILTER (a test-name filter for every test executable, no spaces),
# BELLJAR_STALL_QUIET (seconds without test output before tests/microvm/stall-watch.sh reports
# what the microVMs and daemons do, default 300), BELLJAR_KVM_TRACE=1 (L1's KVM traces its
# guests' exits; the trace's tail is saved after a failed test, see job.sh), BELLJAR_CACHE (images,
# guest kernel), BELLJAR_MICROVM_CACHE (default $BELLJAR_CACHE/microvm-harness).
# Output: progress and timings on stderr, the job's output, and a last line
# `microvm job: N passed, M failed ...`; exit status 0 only when every test passed.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
. "$here/scripts/env.sh"
. "$here/tests/microvm/fetch.sh"

mv_cache="${BELLJAR_MICROVM_CACHE:-$BELLJAR_CACHE/microvm-harness}"
apt_dir="$mv_cache/apt"
limit="${BELLJAR_MICROVM_TIMEOUT:-900}"
mkdir -p "$mv_cache"
t_start=$(date +%s.%N)
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
timing() { printf 'timing: %-32s %6ss\n' "$1" "$2" >&2; }

# Hardware KVM: /dev/kvm opens, the CPU has vmx or svm, and it is not PVM (the same facts
# crates/daemon/src/sandbox/microvm/mod.rs probes).
hardware_kvm() {
  [ -c /dev/kvm ] && { : < /dev/kvm; } 2> /dev/null &&
    grep -qwE 'vmx|svm' /proc/cpuinfo && [ ! -e /sys/module/kvm_pvm ]
}
mode=auto
stress=0
for arg in "$@"; do
  case "$arg" in
    --nested) mode=nested ;;
    --direct) mode=direct ;;
    --stress) stress=1 ;;
    *) echo "usage: $0 [--nested|--direct] [--stress]" >&2; exit 2 ;;
  esac
done
if [ "$stress" = 1 ]; then
  export BELLJAR_MICROVM_FILTER=cycles_and_side_connections_under_load
  export BELLJAR_STRESS_CYCLES="${BELLJAR_STRESS_CYCLES:-200}"
  export BELLJAR_STRESS_INFLIGHT="${BELLJAR_STRESS_INFLIGHT:-4}"
  export BELLJAR_MICROVM_TIMEOUT="${BELLJAR_MICROVM_TIMEOUT:-5400}"
fi
if [ "$mode" = auto ]; then
  if hardware_kvm; then mode=direct; else mode=nested; fi
fi

# --- What the job runs: the binaries, the two test executables, the guest kernel and image.
step "microVM tests: building the binaries and tests"
t=$(date +%s.%N)
cargo build --quiet -p belljard -p belljar-cli -p belljar-vmm -p belljar-agent --bins
test_exe() {
  cargo test --quiet -p "$1" --test "$2" --no-run --message-format=json |
    jq -r 'select(.reason == "compiler-artifact" and .profile.test and .executable != null) | .executable'
}
tests="$(test_exe belljar-vmm linux_boot):$(test_exe belljar-e2e e2e_microvm):$(test_exe belljar-e2e e2e_microvm_snapshots):$(test_exe belljar-e2e e2e_network)"
# The stress test only under --stress: its short version still fails in the job (a nested
# guest's triple fault under load), and a failed test is never retried.
[ "$stress" = 0 ] || tests="$tests:$(test_exe belljar-e2e e2e_microvm_stress)"
# The rootless job (tests/microvm/rootless.sh, run in its own L1 boot by scripts/test.sh): its
# test executables (e2e_microvm last: its test needs the kvm group doctor tells the user to
# join), belljar-ns and the namespace crate's busybox fixtures (L1 has no compiler).
rootless_tests=""
for suite in escape e2e_cli e2e_limits e2e_pause doctor e2e_ports e2e_microvm; do
  rootless_tests="$rootless_tests${rootless_tests:+:}$(test_exe belljar-e2e "$suite")"
done
cargo build --quiet -p belljar-namespace --bin belljar-ns
fixtures=$("$CARGO_TARGET_DIR/debug/belljar-ns" fixtures)
guest_kernel=$(guest-images/kernel/build.sh | tail -1)
[ -f "$BELLJAR_CACHE/images/base/current/rootfs.ext4" ] || {
  echo "the base image is not built: run guest-images/build-all.sh" >&2
  exit 1
}
timing "build (cargo, cached kernel)" "$(elapsed "$t")"

# Debug-info-free copies: a quarter of the size to page in over 9p and to hold in L1's tmpfs.
run_dir="${BELLJAR_MICROVM_RUN:-$mv_cache/run}"
rm -rf "$run_dir" && mkdir -p "$run_dir/results" "$run_dir/bin/deps"
bin_dir=$(dirname "$(dirname "${tests%%:*}")")
for b in belljard belljar belljar-vmm belljar-agent belljar-ns; do
  objcopy --strip-debug "$bin_dir/$b" "$run_dir/bin/$b"
done
stage() {
  local list=$1 out="" t
  IFS=: read -r -a test_list <<< "$list"
  for t in "${test_list[@]}"; do
    objcopy --strip-debug "$t" "$run_dir/bin/deps/${t##*/}"
    out="$out${out:+:}$run_dir/bin/deps/${t##*/}"
  done
  echo "$out"
}
staged=$(stage "$tests")
staged_rootless=$(stage "$rootless_tests")
cp -a "$fixtures" "$run_dir/fixtures"
job_env=(BELLJAR_JOB_BIN="$run_dir/bin" BELLJAR_JOB_TESTS="$staged" BELLJAR_CACHE="$BELLJAR_CACHE"
  BELLJAR_KERNEL="$guest_kernel" BELLJAR_ROOTLESS_TESTS="$staged_rootless"
  BELLJAR_FIXTURES="$run_dir/fixtures" BELLJAR_MICROVM_FILTER="${BELLJAR_MICROVM_FILTER:-}"
  BELLJAR_STALL_QUIET="${BELLJAR_STALL_QUIET:-300}" BELLJAR_KVM_TRACE="${BELLJAR_KVM_TRACE:-}"
  BELLJAR_STRESS_CYCLES="${BELLJAR_STRESS_CYCLES:-}" BELLJAR_STRESS_INFLIGHT="${BELLJAR_STRESS_INFLIGHT:-}"
  BELLJAR_STRESS_MIB="${BELLJAR_STRESS_MIB:-}" BELLJAR_STRESS_CONNECTIONS="${BELLJAR_STRESS_CONNECTIONS:-}"
  BELLJAR_L1_COMPACTION="${BELLJAR_L1_COMPACTION:-}" BELLJAR_L1_PIN="${BELLJAR_L1_PIN:-1}")

finish() {
  local status=$1 summary
  summary=$(cat "$run_dir/results/summary" 2> /dev/null || echo "microvm job: no result")
  timing "total ($mode)" "$(elapsed "$t_start")"
  # Tries that QEMU-TCG's own crash or hang ended, counted apart from the tests: no test runs
  # again after it failed, only those such a crash cut short (tests/microvm/progress.sh).
  [ "$mode" = direct ] || summary="$summary; l1 crashes: ${l1_crashes:-0}"
  echo "$summary"
  exit "$status"
}

if [ "$mode" = direct ]; then
  step "microVM tests: hardware KVM, running the job directly"
  status=0
  env "${job_env[@]}" BELLJAR_RESULTS="$run_dir/results" bash tests/microvm/job.sh || status=$?
  finish "$status"
fi

# --- Nested: QEMU, the L1 kernel and its initramfs, all cached by their inputs.
step "microVM tests: no hardware KVM here, running them nested in a QEMU-TCG guest"
t=$(date +%s.%N)
qemu_note=""
if [ -z "${BELLJAR_MICROVM_REFRESH:-}" ] && [ -s "$mv_cache/qemu.version" ] &&
  [ -s "$mv_cache/kernel.version" ] &&
  [ -d "$mv_cache/$(cut -d' ' -f2 "$mv_cache/kernel.version")/root" ]; then
  use_qemu "$mv_cache/$(cut -d' ' -f2 "$mv_cache/qemu.version")"
  l1_kernel_version=$(cut -d' ' -f1 "$mv_cache/kernel.version")
  l1_kernel_root="$mv_cache/$(cut -d' ' -f2 "$mv_cache/kernel.version")/root"
else
  apt_setup
  fetch_kernel || { echo "cannot fetch Debian's linux-image-amd64" >&2; exit 1; }
  if ! fetch_qemu; then
    rm -f "$mv_cache/qemu.version"
  fi
fi
if [ -n "${qemu_bin:-}" ] && [ -x "$qemu_bin" ]; then
  # Its own loadable modules, never the system QEMU's (those refuse to load into another build).
  qemu=(env LD_LIBRARY_PATH="$qemu_libs" QEMU_MODULE_DIR="$qemu_libs/qemu" "$qemu_bin" -L "$qemu_data")
  qemu_note="QEMU $(cut -d' ' -f1 "$mv_cache/qemu.version") (backports, unpacked)"
  # QEMU 10 crashes L1 far less often than 7.2, but it does: L1's kernel once hit a vCPU
  # thread's stack guard page mid-job ("BUG: TASK stack guard page was hit", Comm: vcpu1).
  # A run that ends without a job status is the emulator's failure, not a test's. On
  # 2026-11-24 one clean-clone run saw both kinds in a row: L1 panicked on a stack guard page
  # right after KVM_RUN, and the retry hung in the first L2 boot with khugepaged blocked (no
  # console output until the timeout). So up to three runs (each bounded by its timeout), and
  # L1 runs without transparent huge pages.
  tries=3
else
  # Debian 12's QEMU 7.2 crashes L1 in about one nested boot of six: allow one retry.
  qemu=(qemu-system-x86_64)
  qemu_note="system QEMU ($(qemu-system-x86_64 --version | head -1)); QEMU from backports was unavailable, so a crashed L1 run is retried once"
  tries=2
fi
echo "L1: $qemu_note; kernel $l1_kernel_version" >&2

# The initramfs: busybox, the init script and the modules KVM (nested SVM) and 9p need, in
# dependency order from modules.dep.
kver=$(ls "$l1_kernel_root/lib/modules" | head -1)
busybox_version=$(dpkg-query -W -f='${Version}' busybox-static 2> /dev/null || /bin/busybox | head -1)
# Modules: KVM with nested SVM and 9p for the job, overlay and tun for the rootless job's
# namespace sandboxes and `belljar doctor`, loop and ext4 (with the crc32c its checksums need,
# which nothing in L1 would load on demand) for reading a microVM's writable
# disk into a snapshot layer, and veth for e2e_network's private test internet (two network
# namespaces joined by a veth pair).
l1_modules="kvm-amd 9p 9pnet_virtio virtio_pci overlay tun loop ext4 crc32c_generic veth"
key=$( { echo "$l1_kernel_version"; echo "$busybox_version"; echo "$l1_modules"; cat tests/microvm/l1-init.sh; } | sha256sum | cut -c1-16)
initrd="$mv_cache/initramfs-$key.cpio.gz"
if [ ! -f "$initrd" ]; then
  moddir="$l1_kernel_root/lib/modules/$kver"
  declare -A seen=()
  order=()
  visit() {
    local m=$1 d
    [ -n "${seen[$m]:-}" ] && return
    seen[$m]=1
    for d in $(awk -v m="$m" -F': *' '$1 == m { print $2 }' "$moddir/modules.dep"); do visit "$d"; done
    order+=("$m")
  }
  for name in $l1_modules; do
    m=$(awk -F: -v n="$name" '{ f = $1; sub(/.*\//, "", f); sub(/\.ko(\.[a-z]+)?$/, "", f); if (f == n) { print $1; exit } }' "$moddir/modules.dep")
    if [ -z "$m" ]; then
      grep -q "/$name.ko" "$moddir/modules.builtin" || { echo "module $name not found" >&2; exit 1; }
      continue
    fi
    visit "$m"
  done
  ird=$(mktemp -d)
  mkdir -p "$ird/bin" "$ird/lib/modules" "$ird/proc" "$ird/sys" "$ird/dev"
  # The kernel opens /dev/console for init before init can mount devtmpfs.
  mknod "$ird/dev/console" c 5 1 2> /dev/null || true
  cp /bin/busybox "$ird/bin/busybox"
  cp tests/microvm/l1-init.sh "$ird/init"
  chmod +x "$ird/init"
  for m in "${order[@]}"; do
    base=$(basename "$m")
    case "$base" in
      *.ko.xz) xz -dc "$moddir/$m" > "$ird/lib/modules/${base%.xz}"; base=${base%.xz} ;;
      *.ko.zst) zstd -qdc "$moddir/$m" > "$ird/lib/modules/${base%.zst}"; base=${base%.zst} ;;
      *) cp "$moddir/$m" "$ird/lib/modules/$base" ;;
    esac
    echo "$base" >> "$ird/modules.order"
  done
  (cd "$ird" && find . | cpio --quiet -o -H newc | gzip -1 > "$initrd.tmp")
  mv "$initrd.tmp" "$initrd"
  rm -rf "$ird"
  echo "L1 initramfs: ${#order[@]} modules -> $initrd" >&2
fi
# The uncompressed ELF kernel boots through its PVH entry point: no decompression under TCG,
# which saves ~10 s of every run (the bzImage is the fallback).
l1_kernel="$l1_kernel_root/boot/vmlinuz-$kver"
if [ ! -s "$l1_kernel_root/boot/vmlinux-$kver" ]; then
  off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$l1_kernel" | head -1 | cut -d: -f1 || true)
  if [ -n "$off" ]; then
    tail -c +$((off + 1)) "$l1_kernel" | xz -dcq > "$l1_kernel_root/boot/vmlinux-$kver.tmp" 2> /dev/null || true
    if [ "$(head -c 4 "$l1_kernel_root/boot/vmlinux-$kver.tmp" | od -An -c | tr -d ' ')" = '177ELF' ]; then
      mv "$l1_kernel_root/boot/vmlinux-$kver.tmp" "$l1_kernel_root/boot/vmlinux-$kver"
    fi
    rm -f "$l1_kernel_root/boot/vmlinux-$kver.tmp"
  fi
fi
[ -s "$l1_kernel_root/boot/vmlinux-$kver" ] && l1_kernel="$l1_kernel_root/boot/vmlinux-$kver"
timing "L1 tools (cached by version)" "$(elapsed "$t")"

# --- The L1 run, under a hard timeout.
{
  echo "JOB_SCRIPT=${BELLJAR_MICROVM_JOB:-$here/tests/microvm/job.sh}"
  # Host paths under /tmp that L1 must see through its own /tmp (l1-init.sh binds them).
  printf 'KEEP_PATHS="%s"\n' "$here $BELLJAR_CACHE $run_dir"
  printf 'JOB_ENV="%s"\n' "${job_env[*]}"
} > "$run_dir/results/job.env"
console="$run_dir/console.log"
hang_limit="${BELLJAR_MICROVM_HANG:-120}"
run_l1() {
  rm -f "$run_dir/results/summary" "$run_dir/results/status"
  # An earlier try's console stays beside (console.1.log, ...): a crash or a stall is in it.
  [ ! -s "$console" ] || mv "$console" "${console%.log}.$((attempt - 1)).log"
  : > "$console"
  local try_limit=$1 t=$(date +%s.%N) rc=0 runner qpid="" cpu last=-1 still=0 hung=0
  timeout -k 10 "$try_limit" "${qemu[@]}" 2> "$run_dir/qemu.log" \
    -accel "tcg,thread=${BELLJAR_MICROVM_TCG_THREAD:-multi}" -M q35 -cpu EPYC,+svm,+npt -smp 2 -m 3072 \
    -kernel "$l1_kernel" -initrd "$initrd" \
    -append "console=ttyS0 panic=-1 mitigations=off loglevel=4 transparent_hugepage=never" \
    -display none -vga none -nic none -audio none -no-reboot -monitor none -serial "file:$console" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
    -virtfs "local,path=$run_dir/results,mount_tag=results,security_model=none" &
  runner=$!
  # A hung L1 (seen under TCG's nested SVM: every vCPU halted, no timer ever firing again, so
  # nothing in L1 runs, not even the job's stall watcher) shows as a QEMU that uses no CPU at
  # all. A busy or idle L1 always uses some: its timer ticks are emulated. Such a try is ended
  # at once and counts as a crash, instead of waiting out the whole limit.
  while kill -0 "$runner" 2> /dev/null; do
    sleep 5
    [ -n "$qpid" ] || qpid=$(pgrep -P "$runner" | head -1 || true)
    [ -n "$qpid" ] || continue
    cpu=$(awk '{ print $14 + $15 }' "/proc/$qpid/stat" 2> /dev/null) || continue
    if [ "$cpu" = "$last" ]; then still=$((still + 5)); else still=0 last=$cpu; fi
    if [ "$still" -ge "$hang_limit" ] && [ "$hung" = 0 ]; then
      echo "L1 hung: QEMU used no CPU for ${still}s (every vCPU halted); ending this try" >&2
      hung=1
      kill "$qpid" 2> /dev/null || true
    fi
  done
  wait "$runner" || rc=$?
  timing "L1 run (boot + job)" "$(elapsed "$t")"
  grep -o 'belljar-l1: chroot ready after [0-9.]*s' "$console" | sed 's/.*after /timing: L1 boot to chroot (guest uptime) /' >&2 || true
  grep -v "TCG doesn't support requested feature" "$run_dir/qemu.log" >&2 || true
  # The job's output (interleaved with L1's kernel messages) from the console, whether or not
  # the try finished: the tests a crashed try passed are not run again (tests/microvm/progress.sh).
  sed -n '/belljar-l1: chroot ready/,$p' "$console"
  [ "$hung" = 0 ] || return 2
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "L1 run timed out after ${try_limit}s (BELLJAR_MICROVM_TIMEOUT, or what was left of BELLJAR_MICROVM_BUDGET)" >&2
    return 2
  fi
  grep -q '^BELLJAR-L1-STATUS=' "$console" || return 2
  return 0
}

# Crashes and hangs of L1 come in runs under TCG (three in a row in one clean-clone run on
# 2026-11-24, each a try): with the hang cut short (above) most failed tries cost a minute or
# two, and a new try runs only the tests no earlier one finished (tests/microvm/progress.sh),
# so every try makes progress. All tries share a time budget: each gets what is left of it (at
# most the timeout), and a new one starts only while BELLJAR_MICROVM_MIN_TRY seconds are left.
tries="${BELLJAR_MICROVM_TRIES:-$tries}"
budget="${BELLJAR_MICROVM_BUDGET:-$((tries * limit))}"
min_try="${BELLJAR_MICROVM_MIN_TRY:-240}"
first_try=$(date +%s)
budget_left() { echo $((budget - ($(date +%s) - first_try))); }
attempt=1
l1_crashes=0
while :; do
  left=$(budget_left)
  try_limit=$((left < limit ? left : limit))
  step "microVM tests: L1 run $attempt of at most $tries (timeout ${try_limit}s, console $console)"
  crashed=0
  run_l1 "$try_limit" || { crashed=1; l1_crashes=$((l1_crashes + 1)); }
  if [ "$crashed" = 0 ] || [ "$attempt" -ge "$tries" ]; then break; fi
  if [ "$(budget_left)" -lt "$min_try" ]; then
    echo "no time for another L1 try within BELLJAR_MICROVM_BUDGET=${budget}s" >&2
    break
  fi
  echo "L1 ended without a job status (a nested crash of L1's kernel?)" >&2
  # The job's output, printed above, ends with the console's tail; before the job began,
  # only the console says what happened.
  grep -q 'belljar-l1: chroot ready' "$console" || tail -n 30 "$console" >&2
  echo "progress so far: $(cat "$run_dir/results/progress" 2> /dev/null | grep -cE '^(passed|failed) ') tests finished" >&2
  attempt=$((attempt + 1))
done

if [ -s "$run_dir/results/stalls.txt" ]; then
  echo "a test went quiet; what its microVMs and daemon did then (tests/microvm/stall-watch.sh):" >&2
  cat "$run_dir/results/stalls.txt" >&2
fi
status=$(cat "$run_dir/results/status" 2> /dev/null ||
  sed -n 's/^BELLJAR-L1-STATUS=\([0-9]*\).*/\1/p' "$console" | tail -1)
if [ "${status:-x}" != 0 ]; then
  echo "microVM job failed (status ${status:-none}); console tail:" >&2
  tail -n 80 "$console" >&2
  [ "$crashed" = 1 ] && status=1
fi
echo "L1: $qemu_note" >&2
finish "${status:-1}"
