# Per-test progress that outlives a crashed L1 try, sourced by job.sh and rootless.sh.
#
# Under TCG's nested SVM, L1's kernel sometimes panics or hangs mid-job (stack guard page hit
# inside KVM_RUN; every vCPU halted). scripts/test-microvm.sh then boots L1 again. A job that
# started over from its first test would rarely finish when such crashes come every few
# minutes; so each test runs alone and its outcome is written, as soon as it is known, to
# $BELLJAR_RESULTS/progress (the host's run directory, over 9p): a later try runs only the
# tests no earlier try finished.
#
# The file holds one line per event: `start KEY` (a run of the test began), `passed KEY`,
# `failed KEY` (it failed twice in a row), `retried KEY` (it passed only on its second run).
# A test whose runs were cut short by three crashes counts as failed: the crash may be its own.

: "${BELLJAR_RESULTS:?}"
progress="$BELLJAR_RESULTS/progress"
touch "$progress"
progress_earlier=$(grep -cE '^(passed|failed) ' "$progress")

# How many runs a crash may cut short before the test counts as failed.
progress_max_starts=3

# The recorded outcome of KEY: passed, failed or nothing.
progress_outcome() {
  awk -v k="$1" '($1 == "passed" || $1 == "failed") && $2 == k { s = $1 } END { print s }' "$progress"
}

# progress_run RUNNER EXE KEY TEST OUT: runs TEST of EXE through `RUNNER EXE OUT --exact TEST`
# (which must set `rc`), unless an earlier try finished it; a failure runs once more (a nested
# microVM occasionally fails to come up; the failed run prints the guest's console and the
# daemon's log). Records the outcome and prints one line about it.
progress_run() {
  local runner=$1 exe=$2 key=$3 test=$4 out=$5 outcome starts run
  outcome=$(progress_outcome "$key")
  if [ -n "$outcome" ]; then
    echo "progress: $key: $outcome in an earlier L1 try"
    return
  fi
  for run in 1 2; do
    starts=$(grep -cxF "start $key" "$progress")
    if [ "$starts" -ge "$progress_max_starts" ]; then
      echo "progress: $key: $starts runs were cut short by L1 crashes; counted as failed"
      echo "failed $key" >> "$progress"
      return
    fi
    echo "start $key" >> "$progress"
    rc=0
    "$runner" "$exe" "$out" --exact "$test"
    if [ "$rc" = 0 ] && grep -qE '^test result: ok\. 1 passed' "$out"; then
      if [ "$run" = 1 ]; then
        echo "passed $key" >> "$progress"
        echo "progress: $key: passed"
      else
        printf 'retried %s\npassed %s\n' "$key" "$key" >> "$progress"
        echo "progress: $key: passed on its second run"
      fi
      return
    fi
    [ "$run" = 2 ] || echo "progress: $key: RETRYING after a failure (exit $rc)"
  done
  echo "failed $key" >> "$progress"
  echo "progress: $key: FAILED twice"
}

# One line for the summary: "N passed, M failed", the tests finished by earlier tries and those
# that passed only when retried.
progress_counts() {
  local passed failed retried line
  passed=$(grep -c '^passed ' "$progress")
  failed=$(grep -c '^failed ' "$progress")
  line="$passed passed, $failed failed"
  [ "$progress_earlier" = 0 ] || line="$line ($progress_earlier finished by earlier L1 tries)"
  retried=$(sed -n 's/^retried //p' "$progress" | tr '\n' ' ')
  [ -z "$retried" ] || line="$line; passed only when retried: $retried"
  echo "$line"
}

# Exit status of the job: 0 only when some test passed and none failed.
progress_status() {
  [ "$(grep -c '^passed ' "$progress")" -gt 0 ] && ! grep -q '^failed ' "$progress"
}
