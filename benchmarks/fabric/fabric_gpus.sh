#!/usr/bin/env bash
# Fabric characterization on one multi-GPU node (not run yet: it needs 2+ GPUs):
#   OUT=/some/dir bash benchmarks/fabric/fabric_gpus.sh h100 8
# charllm-kit fabric over every collective, 1 KiB to 1 GiB, NPROC ranks (NCCL), with NVML
# telemetry, then a comparison and a Markdown report of the bundle, and a profiled TP run of
# gpt3-1.3b across the same GPUs so its collective breakdown sits beside the fabric's curve.
# Files in $OUT: fabric-<tag>.txt (everything printed), fabric-<tag>.json (the measurements),
# report-<tag>.md and report-<tag>_figures/ (busbw curves, profile breakdowns).
set -uo pipefail
PLATFORM="$1"; NPROC="$2"; TAG="${PLATFORM}x$NPROC"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/evidence}"; RUNS=/tmp/fabric-runs; mkdir -p "$OUT" "$RUNS"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  python3 -c "import torch; print('# torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" 2>&1 | tail -1
  echo "# kit commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "\$ charllm-kit fabric --platform $PLATFORM --nproc $NPROC --iters 20 --warmup 5"
  timeout 500 python3 -m kit fabric --platform "$PLATFORM" --nproc "$NPROC" --iters 20 --warmup 5 \
    --out "$RUNS/fabric" 2>&1 | grep -v -i warn
  echo "\$ charllm-kit run gpt3-1.3b --platform $PLATFORM --tp $NPROC --steps 4 --warmup 2 --profile-steps 3"
  timeout 400 python3 -m kit run gpt3-1.3b --platform "$PLATFORM" --tp "$NPROC" --micro-batch 4 \
    --global-batch 16 --steps 4 --warmup 2 --profile-steps 3 --out "$RUNS/tp" 2>&1 \
    | grep -v -i warn | grep -E "^(status|step time|MFU|/)|rror"
  mapfile -t BUNDLES < <(ls -d "$RUNS"/fabric/2* "$RUNS"/tp/2* 2>/dev/null)
  echo "\$ charllm-kit compare <fabric and TP bundles>"
  python3 -m kit compare "${BUNDLES[@]}" 2>&1 | grep -v -i warn
  python3 -m kit report "${BUNDLES[@]}" -o "$OUT/report-$TAG.md" --markdown 2>&1 | grep -v -i warn
  cp "$(ls -d "$RUNS"/fabric/2* | tail -1)/fabric.json" "$OUT/fabric-$TAG.json"
} 2>&1 | tee "$OUT/fabric-$TAG.txt"
