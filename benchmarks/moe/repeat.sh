#!/usr/bin/env bash
# Is the grouped-GEMM gain real? mixtral-8x7b-4l (its first 2 layers on a card under 120 GB, as
# grouped_gemm.sh) at micro-batch 1, global batch 8, SequentialMLP and grouped GEMMs alternating,
# two processes each, then one each with PyTorch's expandable-segments allocator (MoE tensors
# change size with the routing every micro-batch; a fragmented cache frees and reallocates, and
# cudaFree synchronizes). Writes repeat-<tag>.txt and .json into $OUT.
#   bash benchmarks/moe/repeat.sh h100
set -uo pipefail
TAG="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-benchmarks/results}"; RUNS=/tmp/repeat-runs; mkdir -p "$OUT" "$RUNS"
D=fusions,wgrad_fusion,cross_entropy,cuda_graph,fused_adam,foreach_optim
source benchmarks/moe/workload.sh  # sets W
run() {  # run <json name> <--speed>
  local args=(--workload "$W" --micro-batch 1 --global-batch 8 --warmup 3 --steps 6
              --only none --kit-variants "$2" --json "$RUNS/$1.json")
  echo "\$ ${PYTORCH_CUDA_ALLOC_CONF:+PYTORCH_CUDA_ALLOC_CONF=$PYTORCH_CUDA_ALLOC_CONF }python3 benchmarks/engine_throughput.py ${args[*]}"
  python3 benchmarks/engine_throughput.py "${args[@]}" 2>&1 | grep -v -i -E "warn|deprecated|^  " \
    | grep "^kit"
}
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1); workload $W"
  for i in 1 2; do
    run "sequential-$i" "$D"
    run "grouped-$i" "$D,grouped_gemm"
  done
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  run sequential-expandable "$D"
  run grouped-expandable "$D,grouped_gemm"
  python3 - "$RUNS" "$OUT/repeat-$TAG.json" <<'PY'
import json, sys
from pathlib import Path
runs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))}
Path(sys.argv[2]).write_text(json.dumps(runs, indent=2))
PY
} 2>&1 | tee "$OUT/repeat-$TAG.txt"
