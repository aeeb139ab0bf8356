#!/usr/bin/env bash
# GPU smoke of --fsdp (megatron-core's Megatron-FSDP) against plain megatron DDP on one GPU.
# Run from anywhere on the GPU machine: bash benchmarks/parallel/fsdp_smoke.sh
# Needs megatron-core 0.19 for a one-GPU --fsdp run (0.16 is refused: see docs/engines.md).
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/fsdp-smoke}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, einops, megatron.core as m; print('torch', torch.__version__, 'megatron-core', m.__version__, 'einops', einops.__version__)" 2>&1 | tail -1
run() {
  echo "\$ charllm-kit run $*"
  timeout 200 python3 -m kit run "$@" --out "$OUT" 2>&1 | grep -v -i warn \
    | grep -E "measured|^(status|step time|tokens/s|TFLOP|MFU|peak memory)|rror|refused" \
    | awk '/measured/ {last = $0; next} {print} END {if (last) print "last step: " last}'
}
run gpt3-tiny --steps 4 --warmup 1
run gpt3-tiny --steps 4 --warmup 1 --fsdp
run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 5 --warmup 2 --recompute full
run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 5 --warmup 2 --recompute full --fsdp
for b in "$OUT"/2*; do python3 -m kit bundle verify "$b" | tail -1; done
