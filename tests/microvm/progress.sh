# Per-test progress that outlives a crashed L1 try, sourced by job.sh and rootless.sh.
#
# Under TCG's nested SVM, L1's kernel sometimes panics or hangs mid-job (stack guard page hit
# inside KVM_RUN; every vCPU halted). scripts/test-microvm.sh then boots L1 again. A job that
# started over from its first test would rarely finish when such crashes come every few
# minutes; so each test runs alone and its outcome is written, as soon as it is known, to
# $BELLJAR_RESULTS/progress (the host's run directory, over 9p): a later try runs only the
# tests no earlier try finished.
#
# The file holds one line per event: `start KEY` (a run of the test began) and the outcome,
# `passed KEY` or `failed KEY`. A start without an outcome after it is a run that an L1 crash
# cut short: only such a run is run again (by the next L1 try), never a test that failed, and
# three of them fail the test (the crash may be its own). A test that fails once has failed.

: "${BELLJAR_RESULTS:?}"
progress="$BELLJAR_RESULTS/progress"
touch "$progress"
progress_earlier=$(grep -cE '^(passed|failed) ' "$progress")

# How many runs L1 crashes may cut short before the test counts as failed.
progress_max_cut=3

# The recorded outcome of KEY: passed, failed or nothing.
progress_outcome() {
  awk -v k="$1" '($1 == "passed" || $1 == "failed") && $2 == k { s = $1 } END { print s }' "$progress"
}

# progress_record KEY passed|failed: records the outcome of a check the job makes itself (not
# a test executable's test), unless an earlier try recorded one.
progress_record() {
  [ -n "$(progress_outcome "$1")" ] || echo "$2 $1" >> "$progress"
}

# progress_run RUNNER EXE KEY TEST OUT: runs TEST of EXE through `RUNNER EXE OUT --exact TEST`
# (which must set `rc`), unless an earlier try finished it, and records its outcome: passed
# when this run passed, failed when it failed (a failed run prints the guest's console and the
# daemon's log) or when L1 crashes had already cut three runs of it short. Prints one line.
progress_run() {
  local runner=$1 exe=$2 key=$3 test=$4 out=$5 outcome cut
  outcome=$(progress_outcome "$key")
  if [ -n "$outcome" ]; then
    echo "progress: $key: $outcome in an earlier L1 try"
    return
  fi
  cut=$(grep -cxF "start $key" "$progress")
  if [ "$cut" -ge "$progress_max_cut" ]; then
    echo "failed $key" >> "$progress"
    echo "progress: $key: $cut runs were cut short by L1 crashes; counted as failed"
    return
  fi
  echo "start $key" >> "$progress"
  rc=0
  "$runner" "$exe" "$out" --exact "$test"
  if [ "$rc" = 0 ] && grep -qE '^test result: ok\. 1 passed' "$out"; then
    echo "passed $key" >> "$progress"
    echo "progress: $key: passed"
  else
    echo "failed $key" >> "$progress"
    echo "progress: $key: FAILED (exit $rc)"
  fi
}

# One line for the summary: "N passed, M failed", and the tests finished by earlier tries.
progress_counts() {
  local passed failed line
  passed=$(grep -c '^passed ' "$progress")
  failed=$(grep -c '^failed ' "$progress")
  line="$passed passed, $failed failed"
  [ "$progress_earlier" = 0 ] || line="$line ($progress_earlier finished by earlier L1 tries)"
  echo "$line"
}

# Exit status of the job: 0 only when some test passed and none failed.
progress_status() {
  [ "$(grep -c '^passed ' "$progress")" -gt 0 ] && ! grep -q '^failed ' "$progress"
}
