#!/usr/bin/env bash
# The two engines on one GPU at the gpt3-1.3b shape of benchmarks/engine_throughput.py
# (micro-batch 4, global batch 16, bf16, NVML telemetry at 100 ms): megatron-core against
# DeepSpeed ZeRO 1, 2 and 3, then `charllm-kit compare` of the four bundles (megatron is the
# baseline). Afterwards `benchmarks/parallel/dp_scaling.py --gpus 1` as a check that the DP
# scaling script runs on GPUs with NCCL (1 vs 1 rank: the figure itself means nothing).
# Writes engines-<tag>.txt and dp_scaling-<tag>x1.{txt,json} into $OUT.
#   bash benchmarks/smoke/engines_1gpu.sh h100
set -uo pipefail
TAG="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/evidence}"; RUNS=/tmp/engines-runs; mkdir -p "$OUT" "$RUNS"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); kit commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  python3 -c "import torch, megatron.core as m, deepspeed; print('# torch', torch.__version__, 'megatron-core', m.__version__, 'deepspeed', deepspeed.__version__)" 2>&1 | tail -1
  for engine in "" "--engine deepspeed --zero 1" "--engine deepspeed --zero 2" "--engine deepspeed --zero 3"; do
    # shellcheck disable=SC2086
    echo "\$ charllm-kit run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 6 --warmup 2 --telemetry-interval-ms 100 $engine"
    timeout 170 python3 -m kit run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 6 --warmup 2 \
      --telemetry-interval-ms 100 --out "$RUNS" $engine 2>&1 | grep -v -i warn \
      | grep -E "^(status|step time|TFLOP|MFU|peak memory|mean power)|rror|refused|Killed" | head -8
  done
  echo "\$ charllm-kit compare <the four bundles> --baseline <megatron>"
  mapfile -t BUNDLES < <(ls -d "$RUNS"/2*)
  python3 -m kit compare "${BUNDLES[@]}" --baseline "${BUNDLES[0]}" 2>&1 | grep -v -i warn
} 2>&1 | tee "$OUT/engines-$TAG.txt"
{
  echo "\$ python3 benchmarks/parallel/dp_scaling.py --gpus 1 --steps 3 --warmup 2 --accum 2"
  timeout 200 python3 benchmarks/parallel/dp_scaling.py --gpus 1 --steps 3 --warmup 2 --accum 2 \
    --json "$OUT/dp_scaling-${TAG}x1.json" 2>&1 | grep -v -i warn | tail -8
} 2>&1 | tee "$OUT/dp_scaling-${TAG}x1.txt"
