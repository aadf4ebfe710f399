#!/usr/bin/env bash
# Density: how many idle default sandboxes (1 GiB memory limits) one host holds, what each
# costs in memory as the host measures it, and how fast a command still starts in any of them.
#
#   bench/density.sh [SANDBOXES (200)] [EXECS (1000)]
#
# Runs its own daemon in a temporary BELLJAR_HOME (the user's sandboxes are not touched) from
# BIN (default target/release: build belljard and belljar-cli first), creates SANDBOXES
# namespace sandboxes with `belljar create`, as a user would, lets them settle, then prints:
# MemAvailable before and after, per sandbox (noisy on a shared machine); each sandbox's memory cgroup (`belljar usage`)
# and the PSS of its processes, per sandbox; the daemon's RSS growth, per sandbox; and the p50/p99 of EXECS
# `exec true` calls over the API's Unix socket, round-robin over the sandboxes (curl's
# time_total: the request, no process start). Every sandbox is deleted at the end.
set -euo pipefail

n="${1:-200}"
execs="${2:-1000}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${BIN:-$repo/target/release}"
home="$(mktemp -d /tmp/belljar-density.XXXXXX)"
export BELLJAR_HOME="$home" BELLJARD="$bin/belljard"
cli="$bin/belljar"
sock="$home/run/belljard.sock"

meminfo() { awk -v f="$1:" '$1 == f { print int($2 / 1024) }' /proc/meminfo; }
psi() { sed -n 's/^some avg10=\([0-9.]*\).*/\1/p' /proc/pressure/memory 2>/dev/null || echo n/a; }

cleanup() {
    "$cli" ls --json 2>/dev/null | grep -o '"id": *"sbx_[^"]*"' | cut -d'"' -f4 |
        xargs -r -n 16 "$cli" rm >/dev/null 2>&1 || true
    "$cli" daemon stop >/dev/null 2>&1 || true
    rm -rf "$home"
}
trap cleanup EXIT

echo "machine: $(nproc) vCPUs, $(meminfo MemTotal) MiB; kernel $(uname -r); commit $(git -C "$repo" rev-parse --short HEAD)"
"$cli" daemon start >/dev/null
"$cli" ls >/dev/null
daemon_rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$(cat "$home/run/belljard.pid")/status"; }
rss_before="$(daemon_rss)"
before="$(meminfo MemAvailable)"
ids=()
start=$SECONDS
for i in $(seq "$n"); do
    if ! id="$("$cli" create --backend namespace --timeout 1h 2>&1)"; then
        echo "create $i refused: $id"
        break
    fi
    ids+=("$id")
done
echo "created ${#ids[@]} sandboxes in $((SECONDS - start)) s"
[[ ${#ids[@]} -gt 0 ]] || exit 1
sleep 10 # idle: let start-up page cache and the agents' first allocations settle
after="$(meminfo MemAvailable)"
echo "MemAvailable: $before -> $after MiB, $(((before - after) * 1024 / ${#ids[@]})) KiB per sandbox; PSI some avg10 $(psi)"

cg_total=0
pss_total=0
for id in "${ids[@]}"; do
    bytes="$("$cli" usage "$id" --json | grep -o '"memory_bytes": *[0-9]*' | grep -o '[0-9]*$')"
    cg_total=$((cg_total + bytes))
    leaf="${id//_/-}"
    for procs in /sys/fs/cgroup/pids/belljar/"$leaf"/cgroup.procs /sys/fs/cgroup/belljar/"$leaf"/cgroup.procs; do
        [[ -f "$procs" ]] || continue
        while read -r pid; do
            kib="$(awk '/^Pss:/ { print $2 }' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)"
            pss_total=$((pss_total + ${kib:-0}))
        done <"$procs"
        break
    done
done
echo "memory cgroup per sandbox: $((cg_total / 1024 / ${#ids[@]})) KiB; PSS of its processes per sandbox: $((pss_total / ${#ids[@]})) KiB"
rss="$(daemon_rss)"
echo "daemon RSS: $((rss_before / 1024)) -> $((rss / 1024)) MiB, $(((rss - rss_before) / ${#ids[@]})) KiB per sandbox"

times="$(mktemp)"
for i in $(seq 0 $((execs - 1))); do
    id="${ids[$((i % ${#ids[@]}))]}"
    curl -sS --unix-socket "$sock" -o /dev/null -w '%{time_total}\n' \
        -H 'content-type: application/json' -d '{"argv":["true"]}' \
        "http://localhost/v1/sandboxes/$id/commands" >>"$times"
done
sort -n "$times" | awk '{ t[NR] = $1 * 1000 } END {
    printf "exec true over %d sandboxes, %d calls: p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
        n, NR, t[int(NR * 0.5)], t[int(NR * 0.99)], t[NR] }' n="${#ids[@]}"
rm -f "$times"
