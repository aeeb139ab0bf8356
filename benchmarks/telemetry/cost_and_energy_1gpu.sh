#!/usr/bin/env bash
# One GPU, one call (issue 33): where the sampler's CPU goes (sampler_cost_gpu.py), then a
# gpt3-1.3b run with telemetry at 20 ms and Zeus, and its energy cross-checks from metrics.json.
#   OUT=... bash benchmarks/telemetry/cost_and_energy_1gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/cost-energy}"; mkdir -p "$OUT"
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo "# kit commit: ${KIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  python3 benchmarks/telemetry/sampler_cost_gpu.py --seconds "${SECONDS_PER:-8}" --devices 0,0,0,0
  echo "\$ charllm-kit run gpt3-1.3b --dp 1 --micro-batch 2 --global-batch 4 --steps 10 --warmup 3 --telemetry-interval-ms 20"
  python3 -m kit run gpt3-1.3b --dp 1 --micro-batch 2 --global-batch 4 --steps 10 --warmup 3 \
    --telemetry-interval-ms 20 --out "$OUT/runs" 2>&1 | grep -v -iE 'warn|^\s*$' | tail -22
  B=$(ls -d "$OUT"/runs/2* | tail -1)
  python3 - "$B" <<'PY'
import json, sys
m = json.load(open(f"{sys.argv[1]}/metrics.json"))
p = m["power"]
keys = ["energy_j", "energy_source", "power_integral_j", "counter_vs_integral", "zeus_energy_j",
        "zeus_vs_counter", "energy_check_max", "power_samples_min", "counter_readings_min",
        "counter_coverage_min", "window_s", "window_short", "temp_steady"]
print(json.dumps({k: p.get(k) for k in keys}, indent=1))
print("samplers", json.dumps(m.get("samplers")))
print("measured steps", [r["measured_steps"] for r in m["per_rank"]], "notes", m["notes"])
PY
  tar -C "$(dirname "$B")" -czf "$OUT/bundle-1gpu.tar.gz" "$(basename "$B")"
} 2>&1 | tee "$OUT/cost-and-energy.txt"
rm -rf "$OUT/runs"
