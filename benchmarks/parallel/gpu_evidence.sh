#!/usr/bin/env bash
# Issue 5's multi-GPU evidence on one machine with NGPUS (2 or 4) H200s, in parts that each fit
# the device tool's 10-minute call; every part writes flat files into $OUT.
#   benchmarks/parallel/gpu_evidence.sh NGPUS scaling   DP scaling, kit vs plain DDP (2 GPUs)
#   benchmarks/parallel/gpu_evidence.sh NGPUS matrix    the sweep h200x<NGPUS>-matrix.yaml
# `matrix` stops itself after MATRIX_BUDGET_S (default 500) seconds; call it again on the same
# (warm) machine and `--resume` keeps the points already done, until its table shows no
# `pending` point. Each call leaves the sweep's table, a comparison of its bundles and a
# .tar.gz of them in $OUT. The sweep folder lives in results/ (git-ignored), so it persists
# between calls while the machine stays warm.
set -uo pipefail
NGPUS="$1"; PART="$2"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/evidence}"; mkdir -p "$OUT"
TAG="h200x$NGPUS"
header() {
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  python3 -c "import torch, megatron.core as m, deepspeed, zeus; print('torch', torch.__version__, 'megatron-core', m.__version__, 'deepspeed', deepspeed.__version__, 'zeus', zeus.__version__)" 2>&1 | tail -1
  echo "# kit commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
}
case "$PART" in
  scaling)
    {
      header
      echo "\$ python3 benchmarks/parallel/dp_scaling.py --gpus $NGPUS --json dp_scaling-$TAG.json"
      python3 benchmarks/parallel/dp_scaling.py --gpus "$NGPUS" --json "$OUT/dp_scaling-$TAG.json" 2>&1 \
        | grep -v -i warn
    } | tee "$OUT/dp_scaling-$TAG.txt"
    ;;
  matrix)
    SWEEP="benchmarks/parallel/$TAG-matrix.yaml"
    FOLDER="results/parallel/$TAG-matrix"
    {
      header
      echo "\$ charllm-kit sweep $SWEEP --out results/parallel --resume"
      timeout "${MATRIX_BUDGET_S:-500}" python3 -m kit sweep "$SWEEP" --out results/parallel --resume 2>&1 \
        | grep -v -i warn
      mapfile -t BUNDLES < <(ls -d "$FOLDER"/*/2* 2>/dev/null)
      if ((${#BUNDLES[@]})); then
        echo "\$ charllm-kit compare <the sweep's bundles>"
        python3 -m kit compare "${BUNDLES[@]}" 2>&1 | grep -v -i warn
        for b in "${BUNDLES[@]}"; do
          echo "\$ charllm-kit bundle show $(basename "$(dirname "$b")")/$(basename "$b")"
          python3 -m kit bundle show "$b" 2>&1 | grep -v -i warn
        done
      fi
    } 2>&1 | tee "$OUT/matrix-$TAG.txt"
    tar -C results/parallel -czf "$OUT/bundles-$TAG.tar.gz" "$TAG-matrix"
    ;;
  *)
    echo "usage: $0 NGPUS scaling|matrix" >&2; exit 2 ;;
esac
