#!/usr/bin/env bash
# Issue 33's evidence on one machine of several GPUs, in one 10-minute device call:
#   1. benchmarks/telemetry/period_gpu.py: gpt3-1.3b DP<N> with telemetry at 20 ms (sampler
#      alone, then with Zeus) and off, in one script run: throughput ratios, sampler CPU, missed
#      ticks, per-field periods, and the energy cross-checks of each telemetry run;
#   2. sweeps/node4-study-layouts.yaml (resumed if its folder exists) for what time is left,
#      then benchmarks/parallel/energy_summary.py over its points: <gpu>x<N>-energy.json.
#   OUT=... [BUDGET_S=560] bash benchmarks/telemetry/energy_node_gpu.sh
# Files in $OUT (flat): period-<tag>.{txt,json}, period-bundle-<tag>.tar.gz (the full telemetry
# run's manifest, metrics, telemetry and steps), study-layouts-<tag>.txt, <tag>-energy.json,
# bundles-<tag>-study-layouts.tar.gz (each point's manifest.json and metrics.json).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/energy-node}"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
NGPUS=$(nvidia-smi -L | wc -l)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | tr 'A-Z' 'a-z')
TAG="${GPU:-gpu}x$NGPUS"
BUDGET="${BUDGET_S:-560}"
START=$(date +%s)
left() { local s=$((BUDGET - ($(date +%s) - START))); echo $((s > 10 ? s : 10)); }
SWEEPS=results/energy-node
if [[ ! -f "$OUT/period-$TAG.json" && ! -d "$SWEEPS/node4-study-layouts" ]]; then
  python3 benchmarks/telemetry/period_gpu.py --steps 30
  (cd "$OUT" && tar -czf "period-bundle-$TAG.tar.gz" "manifest-$TAG.json" "metrics-$TAG.json" \
     "telemetry-$TAG.parquet" "steps-$TAG.parquet" && rm -f "manifest-$TAG.json" \
     "metrics-$TAG.json" "telemetry-$TAG.parquet" "steps-$TAG.parquet")
fi
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$NGPUS; kit commit ${KIT_COMMIT:-unknown}"
  resume=(); [[ -f "$SWEEPS/node4-study-layouts/sweep.json" ]] && resume=(--resume)
  echo "\$ charllm-kit sweep sweeps/node4-study-layouts.yaml --out $SWEEPS ${resume[*]}"
  timeout --signal=TERM "$(left)" python3 -m kit sweep sweeps/node4-study-layouts.yaml \
    --out "$SWEEPS" "${resume[@]}" 2>&1 | grep -v -iE 'warn|^\s*$'
  echo "\$ python3 benchmarks/parallel/energy_summary.py $SWEEPS/node4-study-layouts --json $TAG-energy.json"
  python3 benchmarks/parallel/energy_summary.py "$SWEEPS/node4-study-layouts" --json "$OUT/$TAG-energy.json"
} 2>&1 | tee -a "$OUT/study-layouts-$TAG.txt"
(cd "$SWEEPS/node4-study-layouts" && find . \( -name manifest.json -o -name metrics.json -o -name sweep.json \) \
   -not -path '*.partial*' -print0 | tar --null -czf "$OUT/bundles-$TAG-study-layouts.tar.gz" -T -)
