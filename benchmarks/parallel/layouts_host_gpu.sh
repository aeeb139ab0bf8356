#!/usr/bin/env bash
# Issue 35's evidence on one machine of four GPUs, in one 10-minute device call that resumes if
# called again (the sweep folder lives in results/layouts-host/, which persists while the
# machine stays warm): gpt3-1.3b at micro-batch 2, global batch 16, one profiled measured step
# per layout (sweeps/node4-layouts-host.yaml: CP2 x TP2 + SP and TP4 + SP at sequence 8192,
# DeepSpeed ZeRO-3 and ZeRO-1, DP4, DP4 with the distributed optimizer, PP2 x DP2, PP4 x VPP2,
# TP2 x PP2 + SP, Megatron-FSDP DP4, last ZeRO-3 with compiled blocks), each held against its
# reference from the same call (benchmarks/parallel/layout_refs.py). The first call also runs
# benchmarks/parallel/cp_attention_gpu.py (which kernels CP attention launches; seconds).
#   benchmarks/parallel/layouts_host_gpu.sh           # on the GPU machine
#   CPU=1 benchmarks/parallel/layouts_host_gpu.sh     # the same plumbing on 2 CPU ranks (gpt3-tiny)
# Writes into $OUT: <gpu>x<N>-layouts-host.txt (what every call printed, appended),
# <gpu>x<N>-layouts-host.json (summarize.py, with gpu_idle_frac and ref_name/ref_step_s),
# <gpu>x<N>-cp-attention.txt and bundles-<gpu>x<N>-layouts-host.tar.gz (each bundle's
# manifest.json, metrics.json, steps.parquet and profile breakdowns). PART_BUDGET_S (default
# 520) bounds the sweep; PYTHON (default python3) is the interpreter; PREVIOUS (default the
# committed results/<gpu>x<N>-layouts-host.json) is the earlier call each ratio is held against
# (layout_refs.py names a drop of more than 10% a regression).
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/lib.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
OUT="${OUT:-results/layouts-host/out}"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
RESULTS="${RESULTS:-results/layouts-host}"; mkdir -p "$RESULTS"
start_budget "${PART_BUDGET_S:-520}"

# Each layout against the one its goal names (layout strings as summarize.py writes them).
PAIRS=(--pair "tp1 pp2 dp2 cp1 ep1" "tp1 pp1 dp4 cp1 ep1"
       --pair "tp1 pp4 dp1 cp1 ep1 vpp2" "tp1 pp1 dp4 cp1 ep1"
       --pair "tp2 pp2 dp1 cp1 ep1 sp" "tp1 pp1 dp4 cp1 ep1"
       --pair "tp1 pp1 dp4 cp1 ep1 fsdp" "tp1 pp1 dp4 cp1 ep1 distopt"
       --pair "tp1 pp1 dp4 cp1 ep1 zero3" "tp1 pp1 dp4 cp1 ep1 zero1"
       --pair "tp1 pp1 dp4 cp1 ep1 zero3 speed-compile+cross_entropy" "tp1 pp1 dp4 cp1 ep1 zero1"
       --loss-pair "tp2 pp1 dp1 cp2 ep1 sp" "tp4 pp1 dp1 cp1 ep1 sp")
if [[ "${CPU:-0}" == 1 ]]; then
  TAG=cpux2 NAME=cpu-layouts-host SWEEP="$RESULTS/cpu-layouts-host.yaml"
  cat > "$SWEEP" <<'EOF'
name: cpu-layouts-host
description: "layouts_host_gpu.sh's plumbing on 2 CPU ranks"
base: {workload: gpt3-tiny, platform: cpu, steps: 3, warmup: 1, telemetry_interval_ms: 0,
       profile_steps: "3", profile_ranks: "0"}
axes:
  - points:
      - {cp: 2, dp: 1}
      - {tp: 2, dp: 1}
      - {engine: deepspeed, zero: 3, dp: 2}
      - {engine: deepspeed, zero: 1, dp: 2}
EOF
  PAIRS=(--pair "tp1 pp1 dp2 cp1 ep1 zero3" "tp1 pp1 dp2 cp1 ep1 zero1"
         --loss-pair "tp1 pp1 dp1 cp2 ep1" "tp2 pp1 dp1 cp1 ep1")
else
  TAG=$(gpu_tag) NAME=node4-layouts-host SWEEP=sweeps/node4-layouts-host.yaml
fi
FOLDER="$RESULTS/$NAME"
{
  echo "# $(date -u +%FT%TZ) $( [[ "${CPU:-0}" == 1 ]] && echo cpu || nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) ($TAG)"
  "$PY" -c "import torch, megatron.core as m, deepspeed; print('# torch', torch.__version__, 'megatron-core', m.__version__, 'deepspeed', deepspeed.__version__)" 2>&1 | tail -1
  echo "# kit commit: ${KIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  if [[ "${CPU:-0}" != 1 && ! -s "$OUT/$TAG-cp-attention.txt" ]]; then
    echo "\$ python3 benchmarks/parallel/cp_attention_gpu.py   # gpt3-1.3b, seq 8192, TP2: 8 heads"
    timeout 90 "$PY" benchmarks/parallel/cp_attention_gpu.py 2>&1 | grep -v -iE 'warn|profiler' \
      | tee "$OUT/$TAG-cp-attention.txt"
  fi
  resume=(); [[ -f "$FOLDER/sweep.json" ]] && resume=(--resume)
  echo "\$ charllm-kit sweep $SWEEP --out $RESULTS ${resume[*]}"
  timeout --signal=TERM "$(left 10)" "$PY" -m kit sweep "$SWEEP" --out "$RESULTS" "${resume[@]}" 2>&1 \
    | grep -v -iE 'warn|^\s*$'
  echo "\$ python3 benchmarks/parallel/layout_refs.py (pairs above) and summarize.py $FOLDER --json $TAG-layouts-host.json"
  "$PY" benchmarks/parallel/summarize.py "$FOLDER" --json "$RESULTS/$TAG-plain.json" > /dev/null
  "$PY" benchmarks/parallel/layout_refs.py "$RESULTS/$TAG-plain.json" "$FOLDER" \
    --out "$RESULTS/$TAG-refs.json" "${PAIRS[@]}" \
    --previous "${PREVIOUS:-benchmarks/parallel/results/$TAG-layouts-host.json}"
  "$PY" benchmarks/parallel/summarize.py "$FOLDER" --json "$OUT/$TAG-layouts-host.json" \
    --refs "$RESULTS/$TAG-refs.json"
  (cd "$FOLDER" && find . \( -name manifest.json -o -name metrics.json -o -name steps.parquet \
     -o -name 'rank*.breakdown.json' -o -name sweep.json \) -not -path '*.partial*' -print0 \
     | tar --null -czf "$OUT/bundles-$TAG-layouts-host.tar.gz" -T -)
} 2>&1 | tee -a "$OUT/$TAG-layouts-host.txt"
