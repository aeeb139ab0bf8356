#!/usr/bin/env bash
# mixtral-8x7b-4l on ONE GPU with megatron-core's per-expert loop (SequentialMLP) and with the
# kit's grouped expert GEMMs (--speed ... grouped_gemm, kit/engines/megatron/grouped_mlp.py):
# engine_throughput.py's kit engine, each variant in a process of its own (a second ~60 GiB
# model in the same process runs out of memory on an 80 GB card), at micro-batch 1 and global
# batch 8 (as the earlier one-GPU MoE run) and at the workload's own global batch 128; with
# PROFILE=1 also one profiled step of each at batch 8 (kernel time by category). The 4-layer
# model peaks at ~106 GiB (benchmarks/parallel/results/moe-h200x1.txt), so on a card under
# 120 GB its first 2 layers are kept (the same per-layer shapes; written to /tmp).
# Writes grouped_gemm-<tag>.txt and .json (every run's figures) into $OUT.
#   PROFILE=1 bash benchmarks/moe/grouped_gemm.sh h100
set -uo pipefail
TAG="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-benchmarks/results}"; RUNS=/tmp/grouped-gemm-runs; mkdir -p "$OUT" "$RUNS"
D=fusions,wgrad_fusion,cross_entropy,cuda_graph,fused_adam,foreach_optim  # the default before
source benchmarks/moe/workload.sh  # sets W
run() {  # run <json name> <global batch> <warmup> <steps> <--speed>: one process, one variant
  local args=(--workload "$W" --micro-batch 1 --global-batch "$2" --warmup "$3" --steps "$4"
              --only none --kit-variants "$5" --json "$RUNS/$1.json")
  echo "\$ python3 benchmarks/engine_throughput.py ${args[*]}"
  python3 benchmarks/engine_throughput.py "${args[@]}" 2>&1 | grep -v -i -E "warn|deprecated|^  "
}
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1); workload $W"
  run sequential 8 2 5 "$D"
  run grouped 8 2 5 "$D,grouped_gemm"
  run grouped-unfused-wgrad 8 2 5 "${D/wgrad_fusion,/},grouped_gemm"
  run sequential-gb128 128 1 2 "$D"
  if [ "${PROFILE:-0}" = 1 ]; then
    for speed in "$D" "$D,grouped_gemm"; do
      echo "\$ python3 benchmarks/perf/profile_step.py --what kit --workload $W --micro-batch 1 --global-batch 8 --speed $speed"
      python3 benchmarks/perf/profile_step.py --what kit --workload "$W" --micro-batch 1 \
        --global-batch 8 --speed "$speed" 2>&1 | grep -v -i -E "warn|deprecated|^  "
    done
  fi
  python3 - "$RUNS" "$OUT/grouped_gemm-$TAG.json" <<'PY'
import json, sys
from pathlib import Path
runs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))}
Path(sys.argv[2]).write_text(json.dumps(runs, indent=2))
PY
} 2>&1 | tee "$OUT/grouped_gemm-$TAG.txt"
