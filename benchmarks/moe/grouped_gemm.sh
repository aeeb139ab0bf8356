#!/usr/bin/env bash
# mixtral-8x7b-4l on ONE GPU with megatron-core's per-expert loop (SequentialMLP) and with the
# kit's grouped expert GEMMs (--speed ... grouped_gemm, kit/engines/megatron/grouped_mlp.py):
# engine_throughput.py's kit default and variants, then one profiled step of each (kernel time by
# category). The 4-layer model peaks at ~106 GiB (benchmarks/parallel/results/moe-h200x1.txt), so
# on a card under 120 GB its first 2 layers are kept (the same per-layer shapes; written to /tmp).
# Micro-batch 1, global batch 8, as the earlier one-GPU MoE run. Writes grouped_gemm-<tag>.txt
# and .json into $OUT.
#   bash benchmarks/moe/grouped_gemm.sh h100
set -uo pipefail
TAG="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-benchmarks/results}"; mkdir -p "$OUT"
D=fusions,wgrad_fusion,cross_entropy,cuda_graph,fused_adam,foreach_optim  # the default before
W=mixtral-8x7b-4l
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$mem_mib" -lt 120000 ]; then
  W=/tmp/mixtral-8x7b-2l.yaml
  python3 - "$W" <<'PY'
import sys, yaml
from kit.spec.loader import load_workload
spec = load_workload("mixtral-8x7b-4l").model_dump(exclude_none=True)
spec.update(name="mixtral-8x7b-2l", num_layers=2,
            description="mixtral-8x7b-4l with 2 of its 4 layers (fits an 80 GB card)")
open(sys.argv[1], "w").write(yaml.safe_dump(spec))
PY
fi
BATCH=(--micro-batch 1 --global-batch 8)
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1); workload $W"
  echo "\$ python3 benchmarks/engine_throughput.py --workload $W ${BATCH[*]} --warmup 2 --steps 5 --only kit --kit-variants \"$D,grouped_gemm;${D/wgrad_fusion,/},grouped_gemm\""
  python3 benchmarks/engine_throughput.py --workload "$W" "${BATCH[@]}" --warmup 2 --steps 5 \
    --only kit --kit-variants "$D,grouped_gemm;${D/wgrad_fusion,/},grouped_gemm" \
    --json "$OUT/grouped_gemm-$TAG.json" 2>&1 | grep -v -i warn
  for speed in "$D" "$D,grouped_gemm"; do
    echo "\$ python3 benchmarks/perf/profile_step.py --what kit --workload $W ${BATCH[*]} --speed $speed"
    python3 benchmarks/perf/profile_step.py --what kit --workload "$W" "${BATCH[@]}" \
      --speed "$speed" 2>&1 | grep -v -i warn
  done
} 2>&1 | tee "$OUT/grouped_gemm-$TAG.txt"
