#!/usr/bin/env bash
# Issue 36 on ONE GPU: where a Mixtral 8x7B step's time goes, and what each candidate lever
# changes. mixtral-8x7b-4l cut in depth (its first 2 layers on a card under 120 GB, all 4 on an
# H200: benchmarks/moe/workload.sh), micro-batch 1, global batch 8 (as grouped_gemm.sh), 2
# warmup and 3 measured steps, the last warmup step profiled (`run --profile`; the engine names
# the MoE stages in the trace, kit/engines/megatron/moe_ranges.py). Variants, one run each:
#   default    the kit's default speed features (grouped expert GEMMs, fused wgrad, ...) and
#              megatron-core's alltoall dispatcher;
#   permute    default + sync_free_permute (kit/engines/megatron/moe_permute.py): the dropless
#              token permutation without masked_select's two device-to-host waits per MoE layer
#              and micro-batch (the lever this script was written to measure);
#   nowgrad    default without wgrad_fusion: expert weight gradients as one grouped GEMM per
#              projection (bf16, added into main_grad by DDP) instead of one fp32-accumulating
#              addmm per expert;
#   allgather  --moe-dispatcher allgather (the other dropless dispatcher: its own permutation);
#   mb2, mb4   default at micro-batch 2 or 4 (bigger expert GEMMs, fewer host gaps and
#              main_grad passes per token).
# GB=<n> sets the global batch (default 8; the workload's own is 128, whose optimizer share is
# 1/16 of batch 8's); TOP=<n> also prints each run's n top kernels per profiled step.
# VARIANTS="default permute" runs a subset (default: default permute nowgrad). Each run is
# capped at 150 s (~60-80 s each on a warm H100), so three fit one 10-minute call with room;
# add allgather when time allows. RUN_TIMEOUT_S changes the cap; W=<workload> runs another
# workload (W=mixtral-tiny RUN_TIMEOUT_S=900 with a stand-in nvidia-smi checked the script on CPU). Prints per variant the step time, MFU and the
# profiled step's breakdown (expert GEMMs, expert other, router, permute/unpermute, AllToAll,
# dense MatMul, attention, optimizer, idle = host gaps ...), and first which of megatron-core's
# TE-free MoE options this machine has. Files in $OUT:
#   breakdown-<tag>.txt     everything printed
#   <tag>x1-moe.json        the points, in the form of benchmarks/parallel/results/h100x4-layouts.json
#   metrics-<variant>.json  each run's metrics.json (expert_load: the routing's imbalance)
#   bash benchmarks/moe/breakdown_1gpu.sh h100
set -uo pipefail
TAG="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-benchmarks/moe/results}"; RUNS=/tmp/moe-breakdown-runs; mkdir -p "$OUT"
rm -rf "$RUNS"; mkdir -p "$RUNS"
DEFAULT=fusions,wgrad_fusion,cross_entropy,cuda_graph,fused_adam,foreach_optim,grouped_gemm
[[ -n "${W:-}" ]] || source benchmarks/moe/workload.sh  # sets W (or W=<workload> to choose)
ARGS=("$W" --micro-batch 1 --global-batch "${GB:-8}" --steps 3 --warmup 2 --profile
      --telemetry-interval-ms 100)
declare -A EXTRA=(
  [default]=""
  [permute]="--speed $DEFAULT,sync_free_permute"
  [nowgrad]="--speed ${DEFAULT/wgrad_fusion,/}"
  [allgather]="--moe-dispatcher allgather"
  [mb2]="--micro-batch 2"
  [mb4]="--micro-batch 4"
)
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1); workload $W"
  echo "# kit commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  python3 - <<'PY' 2>&1 | grep -v -i warn
import dataclasses, importlib.util, torch
import megatron.core as m
from megatron.core.transformer.transformer_config import TransformerConfig
fields = {f.name for f in dataclasses.fields(TransformerConfig)}
te = importlib.util.find_spec("transformer_engine") is not None
print(f"# torch {torch.__version__}, megatron-core {m.__version__}, transformer_engine "
      f"{'importable' if te else 'absent'}; torch._grouped_mm {hasattr(torch, '_grouped_mm')}")
for name in ("moe_permute_fusion", "moe_router_fusion", "moe_grouped_gemm",
             "moe_pad_expert_input_to_capacity", "moe_shared_expert_overlap",
             "overlap_moe_expert_parallel_comm", "moe_flex_dispatcher_backend"):
    print(f"#   TransformerConfig.{name}: {'present' if name in fields else 'absent'}")
print("#   (megatron-core 0.16.1 runs moe_permute_fusion and moe_router_fusion through "
      "Transformer Engine only: without it they raise)")
PY
  BUNDLES=()
  for v in ${VARIANTS:-default permute nowgrad}; do
    # shellcheck disable=SC2086  # EXTRA holds whole options
    echo "\$ charllm-kit run ${ARGS[*]} ${EXTRA[$v]}"
    timeout "${RUN_TIMEOUT_S:-150}" python3 -m kit run "${ARGS[@]}" ${EXTRA[$v]} --out "$RUNS/$v" 2>&1 \
      | grep -v -i warn | grep -E "^(status|step time|MFU|peak memory|mean power|time outside|/)|rror"
    B=$(ls -d "$RUNS/$v"/2* 2>/dev/null | tail -1)
    if [[ -z "$B" ]]; then echo "# $v: no bundle"; continue; fi
    cp "$B/metrics.json" "$OUT/metrics-$v.json"
    BUNDLES+=("$B")
  done
  if ((${#BUNDLES[@]})); then
    DEVICE="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x1"
    echo "\$ python3 benchmarks/moe/breakdown.py <bundles> --json $OUT/${TAG}x1-moe.json"
    python3 benchmarks/moe/breakdown.py "${BUNDLES[@]}" --json "$OUT/${TAG}x1-moe.json" \
      --device "$DEVICE" --top "${TOP:-0}" 2>&1 | grep -v -i warn
    for v in ${VARIANTS:-default permute nowgrad}; do
      [[ -f "$OUT/metrics-$v.json" ]] && python3 -c "import json,sys; l=json.load(open(sys.argv[1]))['expert_load']; print('# expert load', sys.argv[2], {k: l.get(k) for k in ('max_over_mean', 'max_over_mean_worst', 'cv')})" "$OUT/metrics-$v.json" "$v"
    done
  fi
} 2>&1 | tee "$OUT/breakdown-$TAG.txt"
