#!/usr/bin/env bash
# Fault handling on a GPU node (issue 14): what SIGTERM to the job's process group and a
# SIGKILLed launcher leave behind while ranks hold a GPU. Writes its log into $OUT.
#   benchmarks/reliability/gpu_faults.sh DEVICE_NAME
set -uo pipefail
DEV="$1"
export PYTHONUNBUFFERED=1
OUT="${OUT:-results/faults}"; mkdir -p "$OUT"
W=$(mktemp -d)
gpu_procs() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c . ; }
{
  echo "# $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "## timeout -s TERM 60 setsid charllm-kit run gpt3-1.3b --steps 500 (SIGTERM to the whole group)"
  t0=$(date +%s.%N)
  timeout -s TERM 60 python3 -m kit run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 500 \
    --warmup 3 --out "$W/term" > "$W/term.out" 2> "$W/term.err"
  echo "exit $? after $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s (timeout itself: 60 s)"
  B=$(ls -d "$W"/term/2* | tail -1)
  python3 -m kit bundle verify "$B"
  python3 -c "import json,sys; m=json.load(open(sys.argv[1]+'/manifest.json')); print('status', m['status'], '|', m['error']); print('ranks', [(r['status'], r['exit_code'], r['signal']) for r in m['ranks']])" "$B"
  echo "GPU compute processes after it: $(gpu_procs)"

  echo "## setsid charllm-kit run gpt3-1.3b --steps 100000 & ... kill -9 LAUNCHER (what the OOM killer does)"
  setsid python3 -m kit run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 100000 \
    --warmup 3 --out "$W/kill" > "$W/kill.out" 2> "$W/kill.err" &
  L=$!
  for _ in $(seq 1 120); do sleep 1; [ "$(gpu_procs)" -ge 1 ] && \
    [ -n "$(ls "$W"/kill/.*.partial/ranks/rank0.steps.jsonl 2>/dev/null)" ] && \
    [ "$(wc -l < "$(ls "$W"/kill/.*.partial/ranks/rank0.steps.jsonl)")" -ge 8 ] && break; done
  echo "before: GPU compute processes $(gpu_procs), steps streamed $(wc -l < "$(ls "$W"/kill/.*.partial/ranks/rank0.steps.jsonl)")"
  kill -9 "$L"; t0=$(date +%s.%N)
  while [ "$(gpu_procs)" -ge 1 ]; do sleep 0.2; python3 -c "import sys; sys.exit(0 if $(date +%s.%N) - $t0 < 60 else 1)" || break; done
  echo "GPU free $(python3 -c "print(round($(date +%s.%N) - $t0, 1))") s after the launcher's SIGKILL (GPU compute processes: $(gpu_procs))"
  sleep 2
  P=$(ls -d "$W"/kill/.*.partial)
  python3 -m kit bundle recover "$P"
  B=$(ls -d "$W"/kill/2* | tail -1)
  python3 -m kit bundle verify "$B"
  python3 -c "import json,sys; m=json.load(open(sys.argv[1]+'/manifest.json')); print('status', m['status'], '|', m['error']); print('ranks', [(r['status'], r['error']) for r in m['ranks']])" "$B"
  python3 -c "import pyarrow.parquet as pq,sys; print('steps rows', pq.read_table(sys.argv[1]+'/steps.parquet').num_rows, 'telemetry rows', pq.read_table(sys.argv[1]+'/telemetry.parquet').num_rows)" "$B"
} 2>&1 | tee "$OUT/faults-$DEV.txt"
rm -rf "$W"
