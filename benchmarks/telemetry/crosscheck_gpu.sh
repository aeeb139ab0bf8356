#!/usr/bin/env bash
# One real megatron run on this GPU with NVML (20 ms) and Zeus, then what the bundle says about
# its energy: metrics.json power.energy_j (sampled counter), power.zeus_energy_j and
# power.zeus_vs_counter, and manifest telemetry_sources for a fast field (power_w) and a slow
# one (energy_j, read every 100 ms). Writes crosscheck-<tag>.txt into $OUT.
#   bash benchmarks/telemetry/crosscheck_gpu.sh h100
set -uo pipefail
TAG="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/evidence}"; RUNS=/tmp/crosscheck-runs; mkdir -p "$OUT" "$RUNS"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  python3 -c "import torch, megatron.core as m, zeus; print('# torch', torch.__version__, 'megatron-core', m.__version__, 'zeus', zeus.__version__)" 2>&1 | tail -1
  echo "\$ charllm-kit run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 20 --warmup 3"
  python3 -m kit run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 20 --warmup 3 \
    --out "$RUNS" 2>&1 | grep -v -i warn | grep -E "^(status|step time|MFU|mean power|energy)" | head -6
  B=$(ls -d "$RUNS"/2* | tail -1)
  echo "\$ python3 - <bundle>  # power.* and telemetry_sources from the bundle"
  python3 - "$B" <<'PY'
import json, sys
from pathlib import Path
b = Path(sys.argv[1])
m, man = json.loads((b / "metrics.json").read_text()), json.loads((b / "manifest.json").read_text())
p = m["power"]
for k in ("energy_j", "energy_source", "zeus_energy_j", "zeus_vs_counter", "throttle_frac_by_reason"):
    print(f"power.{k}: {p.get(k)}")
for f in ("power_w", "energy_j", "pcie_tx_bytes"):
    print(f"telemetry_sources.{f}: {man['telemetry_sources'][f]}")
PY
  python3 -m kit bundle verify "$B"
} 2>&1 | tee "$OUT/crosscheck-$TAG.txt"
