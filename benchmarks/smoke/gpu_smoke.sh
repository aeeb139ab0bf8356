#!/usr/bin/env bash
# GPU smoke test of the megatron engine: one GPU, bf16, megatron-core's DDP and optimizer.
# Run from the repository root on a GPU host (megatron-core and pydantic on PYTHONPATH).
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-results}"
python3 -m kit run gpt3-tiny --steps 5 --warmup 2 --out "$OUT/res"
python3 -m kit run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 6 --warmup 3 --out "$OUT/res"
