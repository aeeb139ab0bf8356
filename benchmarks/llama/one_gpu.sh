#!/usr/bin/env bash
# llama3-8b-8l (workloads/: Llama 3 8B's full-width layers, 8 of them, vocabulary 128256) on ONE
# GPU: the bf16 GEMM ceiling, the plain PyTorch Llama reference of the same shape in eager and
# with every block torch.compile'd, and the kit's megatron engine (its default speed features),
# each in a process of its own (two ~50-70 GiB models do not share an 80 GB card), all from
# benchmarks/engine_throughput.py at micro-batch 1, global batch 8.
# Writes llama-<tag>.txt and .json (every run's figures) into $OUT.
#   bash benchmarks/llama/one_gpu.sh h100
set -uo pipefail
TAG="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-benchmarks/results}"; RUNS=/tmp/llama-runs; mkdir -p "$OUT" "$RUNS"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
  for only in gemm torch_ref torch_ref_compiled kit; do
    args=(--workload llama3-8b-8l --micro-batch 1 --global-batch 8 --warmup 2 --steps 4
          --only "$only" --json "$RUNS/$only.json")
    echo "\$ python3 benchmarks/engine_throughput.py ${args[*]}"
    python3 benchmarks/engine_throughput.py "${args[@]}" 2>&1 \
      | grep -v -i -E "warn|deprecated|^  |^\[|^W[0-9]"
  done
  python3 - "$RUNS" "$OUT/llama-$TAG.json" <<'PY'
import json, sys
from pathlib import Path
runs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))}
Path(sys.argv[2]).write_text(json.dumps(runs, indent=2))
PY
} 2>&1 | tee "$OUT/llama-$TAG.txt"
