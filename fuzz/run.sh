#!/usr/bin/env bash
# Runs Belljar's fuzz targets one after another, each for a chosen time, and prints per
# target: executions, executions per second, CPU seconds and crashes.
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60 s, every target)
#   fuzz/run.sh --merge [TARGET...]                  fold new coverage into fuzz/corpus/
#
# Needs `cargo install cargo-fuzz` and a nightly toolchain. Targets run one at a time in a
# single process each (the machines are small and shared). What a run finds goes to
# fuzz/runs/<target>/ and crashes to fuzz/artifacts/<target>/ (neither is committed); the
# committed seeds in fuzz/corpus/<target>/ are only read. A crash stops its target (libFuzzer
# prints the input and the reproducer command) and the script goes on to the next one.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/.."

all=(virtio_blk_chain vsock_chain virtio_net_chain agent_request agent_answer tar_upload daemon_body daemon_query guest_frames)
merge=0
if [[ "${1:-}" == "--merge" ]]; then
    merge=1
    shift
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
    seconds="$1"
    shift
fi
seconds="${seconds:-60}"
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${all[@]}")

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/target}"
# Debug assertions on: an arithmetic overflow the guest can cause is a finding.
cargo +nightly fuzz build -a --fuzz-dir fuzz
bin_dir="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release"

printf '%-18s %12s %9s %8s %8s %8s\n' target executions exec/s cpu_s wall_s crashes
for t in "${targets[@]}"; do
    bin="$bin_dir/$t"
    [[ -x "$bin" ]] || { echo "$t: no such target" >&2; exit 2; }
    work="fuzz/runs/$t"
    mkdir -p "$work/corpus" "fuzz/artifacts/$t"
    if [[ $merge -eq 1 ]]; then
        # Keeps only inputs that add coverage to what is committed.
        "$bin" -merge=1 "fuzz/corpus/$t" "$work/corpus" >"$work/merge.log" 2>&1
        echo "$t: $(ls "fuzz/corpus/$t" | wc -l) corpus files"
        continue
    fi
    before=$(ls "fuzz/artifacts/$t" | wc -l)
    start=$(date +%s)
    # user + system CPU seconds of the fuzzer, from bash's own accounting of its children.
    TIMEFORMAT='%U %S'
    # No leak checks (-detect_leaks=0, and none at exit): the harnesses keep one runtime,
    # agent and daemon for the whole process on purpose, and LeakSanitizer would report
    # those as leaks (and stop the run, or write an empty "crash" at its end).
    export ASAN_OPTIONS="detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
    { time "$bin" -max_total_time="$seconds" -print_final_stats=1 -timeout=20 \
        -rss_limit_mb=2048 -max_len=4096 -detect_leaks=0 -artifact_prefix="fuzz/artifacts/$t/" \
        "$work/corpus" "fuzz/corpus/$t" >"$work/log" 2>&1 || true; } 2>"$work/cpu"
    wall=$(($(date +%s) - start))
    read -r user sys <"$work/cpu"
    cpu=$(awk "BEGIN { print $user + $sys }")
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -1)
    crashes=$(($(ls "fuzz/artifacts/$t" | wc -l) - before))
    printf '%-18s %12s %9s %8s %8s %8s\n' "$t" "${execs:-?}" "${rate:-?}" "$cpu" "$wall" "$crashes"
    # Scratch directories of fuzzers that are gone (the harnesses name them by pid).
    for d in /tmp/belljar-fuzz-*-[0-9]*; do
        if [[ -d "$d" ]] && ! kill -0 "${d##*-}" 2>/dev/null; then rm -rf "$d"; fi
    done
done
