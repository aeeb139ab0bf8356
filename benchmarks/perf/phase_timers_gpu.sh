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
SPEED=fusions,wgrad_fusion,cross_entropy,fused_adam,foreach_optim  # no cuda_graph
OUT="${OUT:-results/evidence}"; RUNS=/tmp/phase-runs; mkdir -p "$OUT" "$RUNS"
ARGS=(gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 10 --warmup 3 --telemetry-interval-ms 0
      --speed "$SPEED")
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  python3 -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__)" 2>&1 | tail -1
  for timers in phase-timers no-phase-timers phase-timers no-phase-timers; do
    echo "\$ charllm-kit run ${ARGS[*]} --$timers"
    timeout 200 python3 -m kit run "${ARGS[@]}" "--$timers" --out "$RUNS/$timers" 2>&1 \
      | grep -v -i warn | grep -E "^(status|step time|MFU)|rror"
  done
  LAST=$(ls -d "$RUNS"/phase-timers/2* | tail -1)
  echo "\$ charllm-kit bundle show <the last timed run>"
  python3 -m kit bundle show "$LAST" 2>&1 | grep -v -i warn
} 2>&1 | tee "$OUT/phase-timers-$TAG.txt"
