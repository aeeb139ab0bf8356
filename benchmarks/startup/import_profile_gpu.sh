#!/usr/bin/env bash
# Issue 34's rank-side phases on one GPU, in about 3 minutes of one device call:
#   1. the rank's imports ranked (benchmarks/startup/import_profile.py, megatron engine) as the
#      packages were installed (wheels unpacked with --no-compile, PYTHONDONTWRITEBYTECODE=1:
#      every rank compiles megatron-core, DeepSpeed and pydantic from source), then again
#      after byte-compiling them and the kit once (as a pip install without --no-compile does)
#   2. two `kit run gpt3-1.3b` on this GPU, a fresh compile cache (cold) then the cache it
#      filled (warm), with --json: their lifecycle (launch to first step, phase by phase)
#   3. if time is left, DeepSpeed ZeRO-3's model build in one rank of gpt3-1.3b, timed and
#      profiled (benchmarks/startup/zero3_build_profile.py), then timed without the worker's
#      gc.freeze (as main ran it), and the import profile of each
#      engine named in IMPORT_ENGINES (e.g. IMPORT_ENGINES=deepspeed)
# Writes into $OUT:
#   <gpu>x1-import-profile.txt  what it printed (date, device, versions, commands, tables)
#   <gpu>x1-lifecycle.json      the two runs' status, lifecycle and compile cache
# With this workplace's device tool, carry .whl/ (megatron-core for cp312, deepspeed and the
# pure-Python packages they need); they are installed into /tmp/site when missing.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
START=$(date +%s)
OUT="${OUT:-results/startup/out}"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
source benchmarks/lib.sh
use_carried_wheels
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | tr 'A-Z' 'a-z')
GPU="${GPU:-h100}"
TAG="${GPU}x1"
PLATFORM="${PLATFORM:-$GPU}" WORKLOAD="${WORKLOAD:-gpt3-1.3b}"  # others: a CPU rehearsal
PYPLAT=$([[ "$PLATFORM" == cpu ]] && echo cpu || echo cuda)
RUNS="${RUNS:-/tmp/import-profile-runs}"
start_budget "${BUDGET_S:-170}"

kit_run() {  # NAME CACHE: one gpt3-1.3b run, --json; its answer appended to runs.jsonl
  local name="$1" cache="$2" limit; limit=$(left)
  if (( limit < 30 )); then echo "## $name: not started, ${limit} s left"; return 1; fi
  local cmd=(python3 -m kit run "$WORKLOAD" --platform "$PLATFORM" --dp 1 --micro-batch 2
             --global-batch 4 --steps 4 --warmup 2
             --compile-cache "$cache" --out "$RUNS" --json)
  echo "## $name"; echo "\$ ${cmd[*]}"
  timeout --signal=TERM --kill-after=15 "$limit" "${cmd[@]}" > "$RUNS/$name.out" 2> "$RUNS/$name.err"
  echo "exit $?"
  python3 - "$name" "$RUNS/$name.out" "$RUNS/runs.jsonl" <<'PY'
import json, sys
name, answer, log = sys.argv[1:]
try:
    a = json.loads(open(answer).read().strip().splitlines()[-1])
except (OSError, ValueError, IndexError):
    a = {"error": "no JSON answer"}
entry = {"name": name, "status": a.get("status"), "error": a.get("error"),
         "lifecycle": a.get("lifecycle"), "compile_cache": a.get("compile_cache")}
print(json.dumps(entry, indent=1))
open(log, "a").write(json.dumps(entry) + "\n")
PY
}

{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(nproc) cores"
  python3 -c "from importlib.metadata import version as v; print('# torch', v('torch'), 'megatron-core', v('megatron-core'), 'deepspeed', v('deepspeed'))" 2>&1 | tail -1
  echo "# kit commit: ${KIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-}"
  rm -rf "$RUNS"; mkdir -p "$RUNS"
  echo "## 1a. as installed"
  echo "\$ python3 benchmarks/startup/import_profile.py --engine megatron --platform "$PYPLAT" --repeats 1 --top 15"
  timeout "$(left)" python3 benchmarks/startup/import_profile.py --engine megatron --platform "$PYPLAT" --repeats 1 --top 15 2>&1
  echo "## 1b. byte-compiled once"
  echo "\$ python3 -m compileall -q -j 0 kit $([[ -d /tmp/site ]] && echo /tmp/site)"
  t0=$(date +%s.%N)
  python3 -m compileall -q -j 0 kit $([[ -d /tmp/site ]] && echo /tmp/site) >/dev/null 2>&1
  echo "compileall took $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s"
  echo "\$ python3 benchmarks/startup/import_profile.py --engine megatron --platform "$PYPLAT" --repeats 2 --top 25"
  timeout "$(left)" python3 benchmarks/startup/import_profile.py --engine megatron --platform "$PYPLAT" --repeats 2 --top 25 2>&1
  kit_run cold "$RUNS/cache" && kit_run warm "$RUNS/cache"
  python3 -c "import json, sys; print(json.dumps([json.loads(l) for l in open(sys.argv[1])], indent=1))" \
    "$RUNS/runs.jsonl" > "$OUT/$TAG-lifecycle.json" 2>/dev/null
  if (( $(left) >= 40 )); then
    echo "\$ python3 benchmarks/startup/zero3_build_profile.py --workload $WORKLOAD --platform $PLATFORM --top 40"
    timeout "$(left)" python3 benchmarks/startup/zero3_build_profile.py --workload "$WORKLOAD" \
      --platform "$PLATFORM" --top 40 2>&1 | grep -v -iE 'warn|^\s*$|^\[20'
    if (( $(left) >= 35 )); then  # the same without the worker's gc.freeze, as main ran it
      echo "\$ python3 benchmarks/startup/zero3_build_profile.py --workload $WORKLOAD --platform $PLATFORM --no-cprofile --no-gc-freeze"
      timeout "$(left)" python3 benchmarks/startup/zero3_build_profile.py --workload "$WORKLOAD" \
        --platform "$PLATFORM" --no-cprofile --no-gc-freeze 2>&1 | grep -E '^(import|setup)'
    fi
  else
    echo "## ZeRO-3 model build profile: not started, $(left) s left"
  fi
  for engine in ${IMPORT_ENGINES:-}; do
    if (( $(left) < 25 )); then echo "## $engine profile: not started, $(left) s left"; continue; fi
    echo "\$ python3 benchmarks/startup/import_profile.py --engine $engine --platform cuda --repeats 1 --top 15"
    timeout "$(left)" python3 benchmarks/startup/import_profile.py --engine "$engine" --platform cuda --repeats 1 --top 15 2>&1
  done
  echo "# ended after $(($(date +%s) - START)) s"
} 2>&1 | tee "$OUT/$TAG-import-profile.txt"
