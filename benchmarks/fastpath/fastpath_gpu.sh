#!/usr/bin/env bash
# Issue 56: the study's configurations on the graphed step, on one GPU, in one 10-minute device
# call per part that resumes (bundles stay in results/fastpath/ while the machine is warm).
#   benchmarks/fastpath/fastpath_gpu.sh recompute   gpt3-2.7b (micro-batch 1 and 4) and
#        llama3-8b-8l at global batch 16: recompute none/selective/full graphed, and the
#        recomputing points eager (--speed without cuda_graph) in the same call
#   benchmarks/fastpath/fastpath_gpu.sh moe         Mixtral 8x7B at micro-batch 1 and 4: capacity
#        1.0 padded (graphed) against dropless (eager), global batch 16
# Writes $OUT/<gpu>x1-fastpath-<part>.json (one entry per run: the issue's fields, per-step
# losses; results/<gpu>x1-fastpath.json joins the parts' runs) and
# $OUT/<gpu>x1-fastpath-<part>.txt (each run's command and exit, and the tables).
# FASTPATH_BUDGET_S (default 540) bounds the part: no run starts with less than 60 s left.
set -uo pipefail
PART="${1:?recompute|moe}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/fastpath/out}"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
source benchmarks/lib.sh
use_carried_wheels
start_budget "${FASTPATH_BUDGET_S:-540}"
TAG=$(gpu_tag)
RESULTS=results/fastpath
mkdir -p "$RESULTS"
EAGER=fusions,wgrad_fusion,cross_entropy,fused_adam,foreach_optim,grouped_gemm
LOG="$OUT/$TAG-fastpath-$PART.txt"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  python3 -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__)"
  echo "# kit commit: ${KIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
} | tee -a "$LOG"

# name workload micro_batch recompute speed(default|eager) [extra run options...]
recompute_points() {  # most wanted first: a cut call keeps the headline pairs
  cat <<'P'
2.7b-mb1-none gpt3-2.7b 1 none default
2.7b-mb1-full gpt3-2.7b 1 full default
2.7b-mb1-selective gpt3-2.7b 1 selective default
2.7b-mb1-full-eager gpt3-2.7b 1 full eager
2.7b-mb4-none gpt3-2.7b 4 none default
2.7b-mb4-full gpt3-2.7b 4 full default
l8b-mb1-none llama3-8b-8l 1 none default
l8b-mb1-full llama3-8b-8l 1 full default
2.7b-mb1-selective-eager gpt3-2.7b 1 selective eager
2.7b-mb4-selective gpt3-2.7b 4 selective default
l8b-mb1-selective llama3-8b-8l 1 selective default
2.7b-mb4-full-eager gpt3-2.7b 4 full eager
l8b-mb1-full-eager llama3-8b-8l 1 full eager
P
}
# Mixtral 8x7B: 4 layers on an H200 (workloads/mixtral-8x7b-4l.yaml); on an H100 (80 GB) cut
# to 2 layers, a workload YAML written here from the 4-layer one
moe_workload() {
  if [[ "$TAG" == h200* ]]; then echo mixtral-8x7b-4l; return; fi
  sed -e 's/^name: .*/name: mixtral-8x7b-2l/' -e 's/^num_layers: .*/num_layers: 2/' \
    workloads/mixtral-8x7b-4l.yaml >"$RESULTS/mixtral-8x7b-2l.yaml"
  echo "$RESULTS/mixtral-8x7b-2l.yaml"
}
moe_points() {
  local w; w=$(moe_workload)
  cat <<P
mx-mb1-padded $w 1 none default
mx-mb1-dropless $w 1 none default --moe-capacity none
mx-mb4-padded $w 4 none default
mx-mb4-dropless $w 4 none default --moe-capacity none
P
}

"${PART}_points" | while read -r name workload mb recompute speed extra; do
  dir="$RESULTS/$name"
  if compgen -G "$dir/*/metrics.json" >/dev/null; then echo "# $name: done earlier" | tee -a "$LOG"; continue; fi
  if (( $(left) < 60 )); then echo "# $name: not started, $(left) s left" | tee -a "$LOG"; continue; fi
  rm -rf "$dir"; mkdir -p "$dir"
  speed_opt=(); [[ "$speed" == eager ]] && speed_opt=(--speed "$EAGER")
  # shellcheck disable=SC2086
  cmd=(python3 -m kit run "$workload" --micro-batch "$mb" --global-batch 16 --recompute "$recompute"
       "${speed_opt[@]}" --steps 8 --warmup 2 --out "$dir" $extra)
  echo "\$ ${cmd[*]}" | tee -a "$LOG"
  timeout "$(left 30)" "${cmd[@]}" >"$dir/console.txt" 2>&1
  echo "# exit $? at $(date -u +%FT%TZ)" | tee -a "$LOG"
  grep -vE '^\s*$' "$dir/console.txt" | grep -iE 'error|eager|step 10/10|graph' | tail -4 | tee -a "$LOG"
done
python3 benchmarks/fastpath/summarize.py "$RESULTS" "$TAG" "${KIT_COMMIT:-unknown}" \
  "$OUT/$TAG-fastpath-$PART.json" | tee -a "$LOG"
