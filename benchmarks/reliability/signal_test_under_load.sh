#!/usr/bin/env bash
# Issue 40's check that an interrupted run's exit code does not depend on when a second signal
# lands: RUNS times in a row, tests/test_run_faults.py's group-SIGTERM test (SIGTERM to the
# launcher's group, SIGINT and SIGTERM 0.5 s later, exit code 1 and a verified bundle) runs
# beside one CPU hog per core (a busy `python3` loop each).
#   OUT=benchmarks/reliability/results [RUNS=20] [PYTHON=.venv/bin/python] \
#     bash benchmarks/reliability/signal_test_under_load.sh
# Writes $OUT/signal-test-under-load-<date>.txt: per run pytest's summary line, then the count.
# Exit status: the number of runs that failed.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${OUT:?set OUT to the folder for the results}"; mkdir -p "$OUT"
RUNS="${RUNS:-20}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
TEST="tests/test_run_faults.py::test_sigterm_to_the_whole_group_publishes_an_interrupted_bundle"
REPORT="$OUT/signal-test-under-load-$(date -u +%F).txt"
say() { echo "$*" | tee -a "$REPORT"; }

hogs=()
for _ in $(seq 1 "$(nproc)"); do
  python3 -c 'while True: pass' & hogs+=($!)
done
say "# $(date -u +%FT%TZ) $RUNS runs of $TEST at $(git -C "$REPO" rev-parse --short HEAD),"
say "# $(nproc) CPU hogs beside them"
failed=0
for i in $(seq 1 "$RUNS"); do
  log=$(cd "$REPO" && PYTHONPATH="$REPO" "$PYTHON" -m pytest -q -p no:cacheprovider "$TEST" 2>&1)
  rc=$?
  [[ $rc -eq 0 ]] || failed=$((failed + 1))
  say "run $i: exit $rc: $(echo "$log" | tail -1)"
done
kill "${hogs[@]}" 2>/dev/null
wait "${hogs[@]}" 2>/dev/null
say "passed $((RUNS - failed)) of $RUNS"
exit "$failed"
