#!/usr/bin/env bash
# Issue 36 on one node of 2 or 4 GPUs, in one device call of at most 10 minutes: Mixtral's
# expert-parallel layouts at micro-batch 1 (the issue's table) and at a larger micro-batch (on
# one H200 micro-batch 4 took mixtral-8x7b-4l from 43% to 51% MFU: benchmarks/moe/README.md),
# global batch 16, 2 warmup and 3 measured steps, one profiled step each, then the MoE breakdown
# of every bundle (breakdown.py: expert GEMMs, all-to-all, host gaps ...).
#   4 GPUs: 8x7B EP4 x DP4 (mb 1, 4), 8x7B EP2 x TP2 + SP (mb 1, 4), 8x22B EP4 x DP4 (mb 1, 2)
#   2 GPUs: 8x7B EP2 x DP2 (mb 1, 4)
# Points run in that order while BUDGET_S (default 520) lasts; a point whose bundle is in WORK
# (default /tmp/moe-ep) is not run again, so a second call resumes. Each run is capped at
# RUN_TIMEOUT_S (default 200). Writes into $OUT: ep-<tag>.txt (all printed), <tag>-moe.json
# (the points, as benchmarks/parallel/results/h100x4-layouts.json, with each breakdown).
# W8X7B=, W8X22B= name other workloads (a CPU rehearsal: W8X7B=mixtral-tiny W8X22B=mixtral-tiny
# with a stand-in nvidia-smi on PATH).
#   source benchmarks/lib.sh; use_carried_wheels; OUT=$OUT bash benchmarks/moe/ep_node_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source benchmarks/lib.sh
OUT="${OUT:?set OUT to the folder for the results}"; mkdir -p "$OUT"
WORK="${WORK:-/tmp/moe-ep}"; mkdir -p "$WORK"
BUDGET_S="${BUDGET_S:-520}"
TAG=$(gpu_tag); NGPUS=${TAG##*x}
A="${W8X7B:-mixtral-8x7b-4l}"; B="${W8X22B:-mixtral-8x22b-4l}"
if [ "$NGPUS" -ge 4 ]; then
  POINTS=("a-ep4-mb1|$A --ep 4 --dp 4 --micro-batch 1" "a-ep4-mb4|$A --ep 4 --dp 4 --micro-batch 4"
          "a-ep2tp2-mb1|$A --ep 2 --tp 2 --dp 2 --sp --micro-batch 1"
          "a-ep2tp2-mb4|$A --ep 2 --tp 2 --dp 2 --sp --micro-batch 4"
          "b-ep4-mb1|$B --ep 4 --dp 4 --micro-batch 1" "b-ep4-mb2|$B --ep 4 --dp 4 --micro-batch 2")
else
  POINTS=("a-ep2-mb1|$A --ep 2 --dp 2 --micro-batch 1" "a-ep2-mb4|$A --ep 2 --dp 2 --micro-batch 4")
fi
{
  echo "# $(date -u +%FT%TZ) $TAG: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "# kit commit: ${KIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  BUNDLES=()
  for p in "${POINTS[@]}"; do
    name=${p%%|*}; args=${p#*|}
    if ! ls "$WORK/$name"/2*/manifest.json >/dev/null 2>&1; then
      if (( BUDGET_S - SECONDS < 60 )); then echo "# $name: not started, budget spent"; continue; fi
      # shellcheck disable=SC2086  # args holds whole options
      echo "\$ charllm-kit run $args --global-batch 16 --steps 3 --warmup 2 --profile --telemetry-interval-ms 20"
      # shellcheck disable=SC2086
      timeout "${RUN_TIMEOUT_S:-200}" python3 -m kit run $args --global-batch 16 --steps 3 \
        --warmup 2 --profile --telemetry-interval-ms 20 --out "$WORK/$name" 2>&1 \
        | grep -v -i warn | grep -E "^(status|step time|MFU|peak memory|mean power|time outside)|rror"
    else
      echo "# $name: measured in an earlier call"
    fi
    b=$(ls -d "$WORK/$name"/2* 2>/dev/null | tail -1)
    [[ -n "$b" ]] && BUNDLES+=("$b")
  done
  if ((${#BUNDLES[@]})); then
    echo "\$ python3 benchmarks/moe/breakdown.py <bundles> --json $OUT/$TAG-moe.json --top 8"
    python3 benchmarks/moe/breakdown.py "${BUNDLES[@]}" --json "$OUT/$TAG-moe.json" --top 8 \
      2>&1 | grep -v -i warn
  fi
  echo "# done in ${SECONDS} s"
} 2>&1 | tee -a "$OUT/ep-$TAG.txt"
