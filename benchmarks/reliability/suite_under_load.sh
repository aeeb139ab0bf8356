#!/usr/bin/env bash
# Issue 26's check that the test suite does not depend on an idle host: RUNS times in a row, a
# fresh clone of this repository's HEAD runs exactly what CI runs (`bash .ci/run`: it installs
# its own .venv) while one CPU hog per core (a busy `python3` loop each) competes with it.
#   OUT=benchmarks/reliability/results [RUNS=3] bash benchmarks/reliability/suite_under_load.sh
# Writes $OUT/suite-under-load-<date>.txt: per run the commit, the wall time, the hogs' CPU
# seconds (proof they ran) and pytest's summary line; the full logs go to $WORK/run-<i>.log.
# Exit status: the number of runs that failed.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${OUT:?set OUT to the folder for the results}"; mkdir -p "$OUT"
RUNS="${RUNS:-3}"
WORK="${WORK:-/tmp/suite-under-load}"; mkdir -p "$WORK"
REPORT="$OUT/suite-under-load-$(date -u +%F).txt"
CORES=$(nproc)
say() { echo "$*" | tee -a "$REPORT"; }

say "# $(date -u +%FT%TZ) suite under load: $RUNS runs of 'bash .ci/run' on a fresh clone,"
say "# $CORES CPU hogs beside each (host: $CORES cores, $(free -g | awk '/Mem:/{print $2}') GiB)"
failed=0
for i in $(seq 1 "$RUNS"); do
  clone="$WORK/clone-$i"; rm -rf "$clone"
  git clone -q "$REPO" "$clone" || { say "run $i: clone failed"; failed=$((failed + 1)); continue; }
  commit=$(git -C "$clone" rev-parse --short HEAD)
  hogs=()
  for _ in $(seq 1 "$CORES"); do
    python3 -c 'while True: pass' & hogs+=($!)
  done
  start=$SECONDS
  ( cd "$clone" && bash .ci/run ) >"$WORK/run-$i.log" 2>&1
  rc=$?
  wall=$((SECONDS - start))
  hog_cpu=0
  for p in "${hogs[@]}"; do
    t=$(ps -o times= -p "$p" 2>/dev/null | tr -d ' '); hog_cpu=$((hog_cpu + ${t:-0}))
    kill "$p" 2>/dev/null
  done
  wait "${hogs[@]}" 2>/dev/null
  summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed)|[0-9]+ passed' "$WORK/run-$i.log" | tail -1)
  say "run $i: commit $commit, exit $rc, ${wall} s wall, hogs used ${hog_cpu} CPU s: $summary"
  [ "$rc" = 0 ] || { failed=$((failed + 1)); grep -E '^(FAILED|ERROR) ' "$WORK/run-$i.log" | tee -a "$REPORT"; }
  rm -rf "$clone"
done
say "# $(date -u +%FT%TZ) $((RUNS - failed)) of $RUNS runs passed"
exit "$failed"
