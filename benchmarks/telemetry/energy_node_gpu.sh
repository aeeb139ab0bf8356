#!/usr/bin/env bash
# Issue 33's evidence on one machine of several GPUs, in 10-minute device calls that resume:
#   1. benchmarks/telemetry/period_gpu.py: gpt3-1.3b DP<N> with telemetry at 20 ms (sampler
#      alone, then with Zeus) and off, in one script run: throughput ratios, sampler CPU (whole
#      life and while training), missed ticks, per-field periods, and the energy cross-checks;
#   2. the 4-GPU sweeps in $SWEEPS (default: sweeps/node4-small-shapes.yaml, then the study
#      layouts from point $STUDY_FROM on), each resumed where its folder exists, for the time
#      left; then benchmarks/parallel/energy_summary.py over every sweep folder: <tag>-energy.json.
#   OUT=... [BUDGET_S=560] [STUDY_FROM=1] bash benchmarks/telemetry/energy_node_gpu.sh
# STUDY_FROM=10 runs points 10.. of sweeps/node4-study-layouts.yaml as the sweep
# node4-study-layouts-from-10 (its point ids count from 001 again; the ids of the full sweep are
# in that folder's sweep.json descriptions): the earlier points were measured in an earlier call.
# Call it again on the same warm machine and it goes on where the last call stopped.
# Files in $OUT (flat): period-<tag>.{txt,json}, period-bundle-<tag>.tar.gz (the full telemetry
# run's manifest, metrics, telemetry and steps), energy-sweeps-<tag>.txt, <tag>-energy.json,
# bundles-<tag>-<sweep>.tar.gz (each point's manifest.json and metrics.json).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/energy-node}"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
source benchmarks/lib.sh
TAG=$(gpu_tag); NGPUS=${TAG##*x}
STUDY_FROM="${STUDY_FROM:-1}"
start_budget "${BUDGET_S:-560}"
RESULTS=results/energy-node
mkdir -p "$RESULTS"
if [[ "$STUDY_FROM" -gt 1 ]]; then   # the study layouts from point STUDY_FROM on, as their own sweep
  STUDY="$RESULTS/node4-study-layouts-from-$STUDY_FROM.yaml"
  python3 - "$STUDY_FROM" "$STUDY" <<'PY'
import sys, yaml
start, path = int(sys.argv[1]), sys.argv[2]
spec = yaml.safe_load(open("sweeps/node4-study-layouts.yaml"))
spec["name"] = f"node4-study-layouts-from-{start}"
spec["description"] += f" (points {start}.. of node4-study-layouts)"
spec["axes"][0]["points"] = spec["axes"][0]["points"][start - 1:]
yaml.safe_dump(spec, open(path, "w"), sort_keys=False)
PY
else
  STUDY=sweeps/node4-study-layouts.yaml
fi
SWEEPS="${SWEEPS:-sweeps/node4-small-shapes.yaml $STUDY}"
if [[ ! -f "$OUT/period-$TAG.json" && ! -f "$RESULTS/period-done" ]]; then
  python3 benchmarks/telemetry/period_gpu.py --steps 30
  (cd "$OUT" && tar -czf "period-bundle-$TAG.tar.gz" "manifest-$TAG.json" "metrics-$TAG.json" \
     "telemetry-$TAG.parquet" "steps-$TAG.parquet" && rm -f "manifest-$TAG.json" \
     "metrics-$TAG.json" "telemetry-$TAG.parquet" "steps-$TAG.parquet")
  touch "$RESULTS/period-done"
fi
folders=()
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$NGPUS; kit commit ${KIT_COMMIT:-unknown}"
  for sweep in $SWEEPS; do
    name=$(python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))['name'])" "$sweep")
    folders+=("$RESULTS/$name")
    [[ $(left) -gt 30 ]] || { echo "# no time left for $name: call again to resume it"; continue; }
    resume=(); [[ -f "$RESULTS/$name/sweep.json" ]] && resume=(--resume)
    echo "\$ charllm-kit sweep $sweep --out $RESULTS ${resume[*]}"
    timeout --signal=TERM "$(left)" python3 -m kit sweep "$sweep" --out "$RESULTS" "${resume[@]}" 2>&1 \
      | grep -v -iE 'warn|^\s*$'
  done
  existing=(); for f in "${folders[@]}"; do [[ -f "$f/sweep.json" ]] && existing+=("$f"); done
  echo "\$ python3 benchmarks/parallel/energy_summary.py ${existing[*]} --json $TAG-energy.json"
  python3 benchmarks/parallel/energy_summary.py "${existing[@]}" --json "$OUT/$TAG-energy.json"
} 2>&1 | tee -a "$OUT/energy-sweeps-$TAG.txt"
for f in "$RESULTS"/node4-*/; do
  [[ -f "$f/sweep.json" ]] || continue
  (cd "$f" && find . \( -name manifest.json -o -name metrics.json -o -name sweep.json \) \
     -not -path '*.partial*' -print0 | tar --null -czf "$OUT/bundles-$TAG-$(basename "$f").tar.gz" -T -)
done
