#!/usr/bin/env bash
# Issue 35's FSDP goals on one node, Megatron-FSDP (--fsdp) against PyTorch FSDP2
# (--engine fsdp2) and the layouts each goal names, one profiled measured step
# per point, in 10-minute device calls that resume (the sweep folders live in
# results/fsdp/, which persist while the machine stays warm):
#   PART=small benchmarks/parallel/fsdp_gpu.sh   # gpt3-1.3b mb2 gb16 over every GPU:
#       DP with the distributed optimizer (the reference), FSDP2, FSDP2 with compiled blocks,
#       Megatron-FSDP
#   PART=study benchmarks/parallel/fsdp_gpu.sh   # gpt3-175b-4l mb1 gb16: TP2 + SP x DP(N/2)
#       (the reference), FSDP2, FSDP2 with compiled blocks, Megatron-FSDP
# Writes into $OUT: <gpu>x<N>-fsdp.txt (what every call printed, appended),
# <gpu>x<N>-fsdp-<part>.json (summarize.py with gpu_idle_frac and ref_name/ref_step_s) and
# bundles-<gpu>x<N>-fsdp-<part>.tar.gz (manifest.json, metrics.json, steps.parquet and the
# profile breakdowns). PART_BUDGET_S (default 540) bounds the sweep; PYTHON (default python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/lib.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
PART="${PART:-small}"
OUT="${OUT:-results/fsdp/out}"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
RESULTS="${RESULTS:-results/fsdp}"; mkdir -p "$RESULTS"
start_budget "${PART_BUDGET_S:-540}"
N=$(nvidia-smi -L | wc -l)
TAG=$(gpu_tag) NAME="fsdp-$PART-n$N" SWEEP="$RESULTS/fsdp-$PART-n$N.yaml"
if [[ "$PART" == small ]]; then
  cat > "$SWEEP" <<YAML
name: $NAME
description: "gpt3-1.3b mb2 gb16 on $N GPUs: Megatron-FSDP and FSDP2 against DP with the distributed optimizer"
base: {workload: gpt3-1.3b, micro_batch_size: 2, global_batch_size: 16, steps: 6, warmup: 3,
       telemetry_interval_ms: 20, profile_steps: "5", profile_ranks: "0"}
axes:
  - points:
      - {dp: $N, dist_optimizer: true}
      - {engine: fsdp2, dp: $N}
      - {engine: fsdp2, dp: $N, speed: "compile,cross_entropy"}
      - {dp: $N, fsdp: true}
YAML
  REF="tp1 pp1 dp$N cp1 ep1 distopt"
  PAIRS=(--pair "tp1 pp1 dp$N cp1 ep1 fsdp2" "$REF"
         --pair "tp1 pp1 dp$N cp1 ep1 fsdp2 speed-compile+cross_entropy" "$REF"
         --pair "tp1 pp1 dp$N cp1 ep1 fsdp" "$REF")
else
  cat > "$SWEEP" <<YAML
name: $NAME
description: "gpt3-175b-4l mb1 gb16 on $N GPUs: Megatron-FSDP and FSDP2 against TP2 + SP"
base: {workload: gpt3-175b-4l, micro_batch_size: 1, global_batch_size: 16, steps: 5, warmup: 2,
       telemetry_interval_ms: 20, profile_steps: "4", profile_ranks: "0"}
axes:
  - points:
      - {tp: 2, sp: true, dp: $((N / 2))}
      - {engine: fsdp2, dp: $N}
      - {engine: fsdp2, dp: $N, speed: "compile,cross_entropy"}
      - {dp: $N, fsdp: true}
YAML
  REF="tp2 pp1 dp$((N / 2)) cp1 ep1 sp"
  PAIRS=(--pair "tp1 pp1 dp$N cp1 ep1 fsdp2" "$REF"
         --pair "tp1 pp1 dp$N cp1 ep1 fsdp2 speed-compile+cross_entropy" "$REF"
         --pair "tp1 pp1 dp$N cp1 ep1 fsdp" "$REF")
fi
FOLDER="$RESULTS/$NAME"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) ($TAG), PART=$PART"
  "$PY" -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__)" 2>&1 | tail -1
  echo "# kit commit: ${KIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  resume=(); [[ -f "$FOLDER/sweep.json" ]] && resume=(--resume)
  echo "\$ charllm-kit sweep $SWEEP --out $RESULTS ${resume[*]}"
  timeout --signal=TERM "$(left 10)" "$PY" -m kit sweep "$SWEEP" --out "$RESULTS" "${resume[@]}" 2>&1 \
    | grep -v -iE 'warn|^\s*$'
  "$PY" benchmarks/parallel/summarize.py "$FOLDER" --json "$RESULTS/$TAG-$PART-plain.json" > /dev/null
  "$PY" benchmarks/parallel/layout_refs.py "$RESULTS/$TAG-$PART-plain.json" "$FOLDER" \
    --out "$RESULTS/$TAG-$PART-refs.json" "${PAIRS[@]}"
  "$PY" benchmarks/parallel/summarize.py "$FOLDER" --json "$OUT/$TAG-fsdp-$PART.json" \
    --refs "$RESULTS/$TAG-$PART-refs.json"
  (cd "$FOLDER" && find . \( -name manifest.json -o -name metrics.json -o -name steps.parquet \
     -o -name 'rank*.breakdown.json' -o -name sweep.json \) -not -path '*.partial*' -print0 \
     | tar --null -czf "$OUT/bundles-$TAG-fsdp-$PART.tar.gz" -T -)
} 2>&1 | tee -a "$OUT/$TAG-fsdp.txt"
