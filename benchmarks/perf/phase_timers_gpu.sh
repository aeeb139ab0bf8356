#!/usr/bin/env bash
# The per-phase split on one GPU (CUDA-event timers, kit/engines/megatron/phase_timers.py):
# gpt3-1.3b at the engine_throughput shape with the eager step (CUDA graph off, so the timers
# run), timers on and off twice in alternation to show what they cost, then `bundle show` of
# the last timed run (its per-stage table). Writes phase-timers-<tag>.txt into $OUT.
#   bash benchmarks/perf/phase_timers_gpu.sh h100
set -uo pipefail
TAG="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export CHARLLM_SPEED=fusions,wgrad_fusion,cross_entropy,fused_adam,foreach_optim  # no cuda_graph
OUT="${OUT:-results/evidence}"; RUNS=/tmp/phase-runs; mkdir -p "$OUT" "$RUNS"
ARGS=(gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 10 --warmup 3 --telemetry-interval-ms 0)
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  python3 -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__)" 2>&1 | tail -1
  echo "# CHARLLM_SPEED=$CHARLLM_SPEED"
  for timers in 1 0 1 0; do
    echo "\$ CHARLLM_PHASE_TIMERS=$timers charllm-kit run ${ARGS[*]}"
    CHARLLM_PHASE_TIMERS=$timers timeout 200 python3 -m kit run "${ARGS[@]}" --out "$RUNS/t$timers" 2>&1 \
      | grep -v -i warn | grep -E "^(status|step time|MFU)|rror"
  done
  LAST=$(ls -d "$RUNS"/t1/2* | tail -1)
  echo "\$ charllm-kit bundle show <the last timed run>"
  python3 -m kit bundle show "$LAST" 2>&1 | grep -v -i warn
} 2>&1 | tee "$OUT/phase-timers-$TAG.txt"
