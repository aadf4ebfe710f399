#!/usr/bin/env bash
# Watches one test executable's output in the microVM job (tests/microvm/job.sh) and, when it
# has not grown for a while, prints what every microVM and daemon under the job's data
# directory is doing: the VMM's counters twice (does anything still move?), its threads and
# their stacks, the guest console's tail and the daemon log's tail. A stalled test under TCG
# otherwise only ends in the harness's overall timeout, with nothing to say why.
#
# Usage: stall-watch.sh OUT_FILE DATA_DIR [QUIET_SECONDS]  (runs until OUT_FILE's writer is
# gone; job.sh starts it in the background next to each test executable and kills it after).
# Output: lines starting `stall:` on stdout (and appended to $BELLJAR_RESULTS/stalls.txt),
# at most once per quiet spell.
set -uo pipefail
out=$1 data=$2 quiet=${3:-300}

metrics() { # $1: a VMM control socket
  python3 - "$1" << 'EOF' 2>&1
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect(sys.argv[1])
s.sendall(b'{"cmd":"metrics"}\n')
buf = b""
while not buf.endswith(b"\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    buf += chunk
m = json.loads(buf).get("metrics", {})
print("vcpus", [(v["id"], v["exits"], v["io_exits"], v["halt_exits"]) for v in m.get("vcpus", [])])
print("devices", [(d["name"], d["bytes_in"], d["bytes_out"], d["requests"], d["errors"]) for d in m.get("devices", [])])
EOF
}

report() {
  echo "stall: no output for ${quiet}s from $(basename "$out") at $(date +%T); what runs:"
  local sock dir pid
  for sock in $(find "$data" -name vmm.sock 2> /dev/null); do
    dir=$(dirname "$sock")
    echo "stall: == microVM $dir"
    metrics "$sock" | sed 's/^/stall:   now   /'
    sleep 10 # the second sample tells a busy guest from a stuck one
    metrics "$sock" | sed 's/^/stall:   +10 s /'
    [ -f "$dir/console.log" ] && tail -n 40 "$dir/console.log" | sed 's/^/stall:   console: /'
  done
  for pid in $(pgrep -x belljar-vmm) $(pgrep -x belljard); do
    echo "stall: == $(cat /proc/"$pid"/comm) pid $pid threads (state wchan):"
    for t in /proc/"$pid"/task/*; do
      echo "stall:   $(cat "$t/comm" 2> /dev/null) $(awk '{print $3}' "$t/stat" 2> /dev/null) $(cat "$t/wchan" 2> /dev/null)"
    done
    if command -v gdb > /dev/null; then
      timeout 120 gdb -p "$pid" -batch -ex 'thread apply all bt 12' 2> /dev/null |
        grep -E '^(Thread|#)' | sed 's/^/stall:   /'
    fi
  done
  for log in $(find "$data" -name 'belljard.log' 2> /dev/null); do
    tail -n 30 "$log" | sed "s|^|stall:   $(basename "$(dirname "$log")") log: |"
  done
}

size=-1 still=0 reported=0
while [ -e "$out" ]; do
  now=$(stat -c %s "$out" 2> /dev/null || echo -1)
  if [ "$now" != "$size" ]; then
    size=$now still=0 reported=0
  else
    still=$((still + 20))
    if [ "$still" -ge "$quiet" ] && [ "$reported" = 0 ]; then
      # Also into the results share: a run that then times out keeps it.
      report 2>&1 | tee -a "${BELLJAR_RESULTS:-/dev/null}/stalls.txt"
      reported=1
    fi
  fi
  sleep 20
done
