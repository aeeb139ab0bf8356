#!/usr/bin/env bash
# The deepspeed engine against the megatron engine on ONE GPU at the gpt3-1.3b shape of
# benchmarks/engine_throughput.py (micro-batch 4, global batch 16): megatron (default speed
# features), then DeepSpeed ZeRO 1, 2 and 3 with the deepspeed engine's speed features on (its
# default: compile, cross_entropy), ZeRO-1 with them off (--speed none), and ZeRO-3 with
# DeepSpeed's stage-3 knobs opened up (overlapped gathers, larger prefetch bucket, more live
# parameters, small parameters kept whole).
# Every run is its own process (DeepSpeed keeps global state). Writes speed-<tag>.txt and
# .json (every run's figures) into $OUT.
#   bash benchmarks/deepspeed/speed.sh h100
set -uo pipefail
TAG="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-benchmarks/deepspeed/results}"; RUNS=/tmp/ds-speed-runs; mkdir -p "$OUT" "$RUNS"
Z3='{"zero_optimization": {"overlap_comm": true, "stage3_prefetch_bucket_size": 200000000, "stage3_max_live_parameters": 3000000000, "stage3_param_persistence_threshold": 1000000}}'
run() {  # run <json name> <engine_throughput.py args...>: one process
  local name="$1"; shift
  local args=(--warmup 2 --steps 5 "$@" --json "$RUNS/$name.json")
  echo "\$ python3 benchmarks/engine_throughput.py ${args[*]}"
  timeout 150 python3 benchmarks/engine_throughput.py "${args[@]}" 2>&1 \
    | grep -E "^(kit|[0-9]{4}-)|Error|rror:" | grep -v -i warn | tail -4
}
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
  python3 -c "import torch, megatron.core as m, deepspeed; print('# torch', torch.__version__, 'megatron-core', m.__version__, 'deepspeed', deepspeed.__version__)" 2>&1 | tail -1
  # most telling first: a device call may end before the last
  run megatron --only kit
  run zero1 --engine deepspeed --zero 1 --only kit
  run zero3-open --engine deepspeed --zero 3 --only kit --ds-config "$Z3"
  run zero2 --engine deepspeed --zero 2 --only kit
  run zero1-none --engine deepspeed --zero 1 --only none --kit-variants none
  run zero3 --engine deepspeed --zero 3 --only kit
  python3 - "$RUNS" "$OUT/speed-$TAG.json" <<'PY'
import json, sys
from pathlib import Path
runs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*.json"))}
Path(sys.argv[2]).write_text(json.dumps(runs, indent=2))
base = runs.get("megatron", {}).get("kit_tflops")
for name, r in runs.items():
    for variant, row in r.get("variants", {}).items():
        if "tflops" in row:
            ratio = f"  {row['tflops'] / base:.2f}x megatron" if base else ""
            print(f"# {name:12s} {variant:10s} {row['tflops']:6.1f} TFLOP/s  "
                  f"{row['step_s'] * 1e3:7.1f} ms  {row['peak_mem_gib']:5.1f} GiB{ratio}")
        else:
            print(f"# {name:12s} {variant:10s} {row}")
PY
} 2>&1 | tee "$OUT/speed-$TAG.txt"
