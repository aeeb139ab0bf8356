#!/usr/bin/env bash
# DeepSpeed ZeRO-Offload on one GPU at the gpt3-1.3b shape of engines_1gpu.sh (micro-batch 4,
# global batch 16, bf16, NVML telemetry at 100 ms): ZeRO 1, 2 and 3 with `--offload` (optimizer
# states and step on the host, DeepSpeed's CPU Adam, built just in time on first use), then
# `charllm-kit compare` of the three bundles. The runs without offload are in
# engines-h100-2026-11-24.txt. Writes zero-offload-<tag>.txt into $OUT.
#   bash benchmarks/smoke/zero_offload_1gpu.sh h100
set -uo pipefail
TAG="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-/tmp/torch-extensions}"
OUT="${OUT:-results/evidence}"; RUNS=/tmp/offload-runs; mkdir -p "$OUT" "$RUNS"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $(nproc) host cores"
  python3 -c "import torch, deepspeed; print('# torch', torch.__version__, 'deepspeed', deepspeed.__version__)" 2>&1 | tail -1
  for zero in 1 2 3; do
    echo "\$ charllm-kit run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 6 --warmup 2 --telemetry-interval-ms 100 --engine deepspeed --zero $zero --offload"
    start=$(date +%s)
    timeout 280 python3 -m kit run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 6 --warmup 2 \
      --telemetry-interval-ms 100 --out "$RUNS" --engine deepspeed --zero "$zero" --offload 2>&1 \
      | grep -v -i warn \
      | grep -E "^(status|step time|TFLOP|MFU|peak memory|mean power|error)|rror|refused|Killed|cpu_adam|Time to load" | head -10
    echo "(wall clock of the whole run, with setup and any cpu_adam build: $(( $(date +%s) - start )) s)"
  done
  echo "\$ charllm-kit compare <the three bundles> --baseline <zero 1>"
  mapfile -t BUNDLES < <(ls -d "$RUNS"/2*)
  python3 -m kit compare "${BUNDLES[@]}" --baseline "${BUNDLES[0]}" 2>&1 | grep -v -i warn
} 2>&1 | tee "$OUT/zero-offload-$TAG.txt"
