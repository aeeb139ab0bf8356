#!/usr/bin/env bash
# The EP points' workload (workloads/mixtral-8x7b-4l.yaml: Mixtral 8x7B's full-width layers, four
# of them, ~6.1B parameters) on ONE H200 before the 2- and 4-GPU machines are lent: the memory
# estimate (`run --dry-run`) against the measured peak, and one run each with full activation
# recomputation off and on (nvml + zeus + host telemetry at 20 ms), then `charllm-kit compare`.
# EP is 1 here: the alltoall dispatcher and megatron-core's MoE layer run without expert
# communication. Writes moe-<tag>.txt into $OUT.
#   bash benchmarks/parallel/moe_1gpu.sh h200
set -uo pipefail
TAG="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/evidence}"; RUNS=/tmp/moe-runs; mkdir -p "$OUT" "$RUNS"
ARGS=(mixtral-8x7b-4l --micro-batch 1 --global-batch 8 --steps 4 --warmup 2)
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  python3 -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__)" 2>&1 | tail -1
  for recompute in none full; do
    echo "\$ charllm-kit run ${ARGS[*]} --recompute $recompute --dry-run"
    python3 -m kit run "${ARGS[@]}" --recompute "$recompute" --dry-run 2>&1 | grep -v -i warn \
      | sed -n '/^memory estimate/,/^memory:/p'
    echo "\$ charllm-kit run ${ARGS[*]} --recompute $recompute --telemetry-interval-ms 20"
    timeout 240 python3 -m kit run "${ARGS[@]}" --recompute "$recompute" --telemetry-interval-ms 20 \
      --out "$RUNS" 2>&1 | grep -v -i warn | grep -v "^mixtral-8x7b-4l on" | tail -14
  done
  mapfile -t BUNDLES < <(ls -d "$RUNS"/2*)
  echo "\$ charllm-kit compare <both bundles> --baseline <recompute none>"
  python3 -m kit compare "${BUNDLES[@]}" --baseline "${BUNDLES[0]}" 2>&1 | grep -v -i warn
  for b in "${BUNDLES[@]}"; do python3 -m kit bundle verify "$b" 2>&1 | tail -1; done
} 2>&1 | tee "$OUT/moe-$TAG.txt"
