#!/usr/bin/env bash
# Telemetry evidence on one GPU machine: NVML probe, a telemetry run (nvml + zeus + host),
# its energy check, a replay trace, and the overhead figures. Writes flat files into $OUT.
#   benchmarks/telemetry/gpu_evidence.sh DEVICE_NAME [NGPUS]
# SKIP_OVERHEAD=1 leaves out the overhead figures (several runs) when only the bundle is wanted.
set -uo pipefail
DEV="$1"; NGPUS="${2:-1}"
export PYTHONUNBUFFERED=1
OUT="${OUT:-results/evidence}"; mkdir -p "$OUT"
{
  echo "# $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$NGPUS"
  python3 -c "import torch, megatron.core as m, zeus; print('torch', torch.__version__, 'megatron-core', m.__version__, 'zeus', zeus.__version__)"
  echo "## python3 benchmarks/telemetry/nvml_probe.py"
  python3 benchmarks/telemetry/nvml_probe.py
  echo "## charllm-kit run gpt3-1.3b --dp $NGPUS --micro-batch 4 --global-batch $((16 * NGPUS)) --steps 20 --warmup 3 --telemetry-interval-ms 20"
  python3 -m kit run gpt3-1.3b --dp "$NGPUS" --micro-batch 4 --global-batch $((16 * NGPUS)) \
    --steps 20 --warmup 3 --telemetry-interval-ms 20 --out "$OUT/runs" 2>&1 | grep -v -i warn | tail -14
  B=$(ls -d "$OUT"/runs/2* | tail -1)
  echo "## python3 benchmarks/telemetry/energy_check.py BUNDLE"
  python3 benchmarks/telemetry/energy_check.py "$B"
  python3 -m kit bundle verify "$B"
} 2>&1 | tee "$OUT/telemetry-$DEV.txt"
B=$(ls -d "$OUT"/runs/2* | tail -1)
cp "$B/telemetry.parquet" "$OUT/trace-$DEV.parquet"
python3 - "$B" "$OUT/trace-$DEV.devices.json" <<'PY'
import json, sys
m = json.load(open(f"{sys.argv[1]}/manifest.json"))
json.dump(m["inventory"][0]["gpus"], open(sys.argv[2], "w"), indent=1)
PY
tar -C "$(dirname "$B")" -czf "$OUT/bundle-$DEV.tar.gz" "$(basename "$B")"
if [[ "$NGPUS" == 1 && "${SKIP_OVERHEAD:-0}" != 1 ]]; then
  python3 benchmarks/telemetry/overhead.py "$DEV" "$OUT" 2>&1 | tee "$OUT/overhead-$DEV.txt"
fi
rm -rf "$OUT/runs" "$OUT/overhead-runs"
