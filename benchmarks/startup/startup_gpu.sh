#!/usr/bin/env bash
# Issue 34's evidence in one device call of at most 10 minutes on a machine of four GPUs: each
# sweep once with a fresh compile cache (cold) and again with the cache it filled (warm):
#   1. benchmarks/startup/startup-core.yaml: gpt3-1.3b DP4, TP2+SP x DP2, ZeRO-3 DP4
#   2. the first 8 points of sweeps/node4-small-shapes.yaml (its settings: telemetry at 20 ms,
#      one profiled step), if time is left
# Sweep folders and caches live in results/startup/ (kept while the machine stays warm): a rerun
# skips what is done and resumes a sweep that ran out of time. It stops starting work after
# BUDGET_S (default 540) seconds and ends before 9.5 minutes. Writes into $OUT:
#   <gpu>x<N>-startup.json  one entry per point (benchmarks/startup/summarize.py), sweep walls
#   <gpu>x<N>-startup.txt   what it printed (date, device, versions, commands, the table)
# With this workplace's device tool, carry .whl/ (megatron-core for cp312, deepspeed, zeus and
# the pure-Python packages they need); they are installed into /tmp/site when missing.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
START=$(date +%s)
HARD_END=$((START + ${HARD_S:-560}))  # every child is gone by then (default 9 min 20 s)
OUT="${OUT:-results/startup/out}"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
RESULTS="${RESULTS:-results/startup}"; mkdir -p "$RESULTS"
CORE="${CORE_SWEEP:-benchmarks/startup/startup-core.yaml}"  # other files: a CPU rehearsal
SMALL="${SMALL_SWEEP:-sweeps/node4-small-shapes.yaml}"
source benchmarks/lib.sh
use_carried_wheels
TAG=$(gpu_tag); NGPUS=${TAG##*x}
start_budget "${BUDGET_S:-540}"

sweep_files() {  # [NAME SOURCE POINTS]...: $RESULTS/NAME.yaml, SOURCE renamed, its first POINTS
  python3 - "$RESULTS" "$@" <<'PY'
import sys, yaml
results, args = sys.argv[1], sys.argv[2:]
for name, source, points in zip(args[0::3], args[1::3], args[2::3]):
    spec = yaml.safe_load(open(source))
    spec["name"] = name
    spec["axes"][0]["points"] = spec["axes"][0]["points"][: int(points)]
    with open(f"{results}/{name}.yaml", "w") as f:
        yaml.safe_dump(spec, f, sort_keys=False)
PY
}

run_sweep() {  # NAME CACHE_DIR FRESH(1|0)
  local name="$1" cache="$2" fresh="$3" folder="$RESULTS/$1"
  if python3 benchmarks/startup/summarize.py --complete "$folder"; then
    echo "## $name: done in an earlier call"; return 0
  fi
  local budget hard; budget=$(left); hard=$((HARD_END - $(date +%s) - 25))
  (( hard < budget )) && budget=$hard
  if (( budget < 45 )); then echo "## $name: not started, ${budget} s left"; return 1; fi
  local resume=()
  if [[ -f "$folder/sweep.json" ]]; then resume=(--resume)
  elif [[ "$fresh" == 1 ]]; then rm -rf "$cache"; fi  # a cold sweep starts from nothing
  echo "## $name (compile cache $cache, $([[ -d $cache ]] && echo 'as the cold pass left it' || echo fresh))"
  echo "\$ CHARLLM_COMPILE_CACHE=$cache charllm-kit sweep $RESULTS/$name.yaml --out $RESULTS ${resume[*]}"
  local t0 t1
  t0=$(date +%s.%N)
  CHARLLM_COMPILE_CACHE="$cache" timeout --signal=TERM --kill-after=20 "$budget" \
    python3 -m kit sweep "$RESULTS/$name.yaml" --out "$RESULTS" "${resume[@]}" 2>&1 \
    | grep -v -iE 'warn|^\s*$' | tail -40
  t1=$(date +%s.%N)
  echo "$name $t0 $t1" >> "$RESULTS/walls.txt"
}

{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$NGPUS, driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  python3 -c "from importlib.metadata import version as v; print('# torch', v('torch'), 'megatron-core', v('megatron-core'), 'deepspeed', v('deepspeed'))" 2>&1 | tail -1
  echo "# kit commit: ${KIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  sweep_files startup-core-cold "$CORE" 3 startup-core-warm "$CORE" 3 \
    small8-cold "$SMALL" 8 small8-warm "$SMALL" 8
  run_sweep startup-core-cold "$RESULTS/cache-core" 1 \
    && run_sweep startup-core-warm "$RESULTS/cache-core" 0 \
    && run_sweep small8-cold "$RESULTS/cache-small8" 1 \
    && run_sweep small8-warm "$RESULTS/cache-small8" 0
  echo "\$ python3 benchmarks/startup/summarize.py $RESULTS --json $OUT/$TAG-startup.json"
  python3 benchmarks/startup/summarize.py "$RESULTS" --json "$OUT/$TAG-startup.json" \
    --device "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$NGPUS"
  echo "# ended after $(($(date +%s) - START)) s"
} 2>&1 | tee -a "$OUT/$TAG-startup.txt"
