#!/usr/bin/env bash
# Issue 21's GPU evidence on one H100: where a gpt3-1.3b step's time goes, and its Chakra ET.
#   OUT=/some/dir bash benchmarks/profile/profile_h100.sh
# Two runs of gpt3-1.3b at the engine_throughput shape (micro-batch 4, global 16), 2 warmup and
# 4 measured steps, profiling measured step 3 (steps 2, 4, 5 run unprofiled):
#   graph:  the kit default (the step replays a CUDA graph), --profile-steps 3;
#   eager:  CUDA graph off (--speed without cuda_graph), --profile-steps 3 --chakra, so
#           the execution trace sees every operator; its ET is linked and converted by Chakra
#           when the chakra package is installed (pip install --no-deps third_party/wheels/*.whl
#           holistictraceanalysis==0.5.0 and the `chakra` extra; the script tries, offline it
#           may not, and says so).
# MODES="graph" or MODES="eager" runs one of them (each stays under 250 s, so both fit one
# 10-minute call on a warm machine; split them if setup is slow). Each run's breakdown is printed and checked by check_breakdown.py (categories sum to the
# profiled window, and within 3% of the step's wall time). Files in $OUT (at most 8):
#   profile-h100.txt                  everything printed
#   breakdown-{graph,eager}-rank0.json profile/rank0.breakdown.json of each run
#   metrics-{graph,eager}.json        each run's metrics.json (notes say what the profiler did)
#   chakra-rank0.et.gz                the eager step's Chakra ET, when converted and <= 16 MiB
#   host_et-rank0.json.gz             its PyTorch execution trace, when <= 16 MiB
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/evidence}"; RUNS=/tmp/profile-runs; mkdir -p "$OUT" "$RUNS"
ARGS=(gpt3-1.3b --platform h100 --micro-batch 4 --global-batch 16 --steps 4 --warmup 2
      --profile-steps 3 --telemetry-interval-ms 50)
EAGER_SPEED=fusions,wgrad_fusion,cross_entropy,fused_adam,foreach_optim
MAX_BYTES=$((16 * 1024 * 1024))
keep() {  # keep <file> <name>: gzip a file into $OUT when it fits the size limit
  if [[ -f "$1" ]]; then
    gzip -c "$1" > "$OUT/$2"
    if (($(stat -c %s "$OUT/$2") > MAX_BYTES)); then
      echo "# $2: $(stat -c %s "$OUT/$2") bytes gzipped, over 16 MiB: not kept"; rm -f "$OUT/$2"
    fi
  else
    echo "# $2: not produced ($1 missing)"
  fi
}
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  python3 -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__)" 2>&1 | tail -1
  echo "# kit commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  if ! python3 -c "import chakra.src.trace_link.trace_linker" 2>/dev/null; then
    echo "\$ pip install --no-deps third_party/wheels/*.whl holistictraceanalysis==0.5.0 && pip install -e .[chakra]"
    python3 -m pip install -q --no-deps third_party/wheels/*.whl holistictraceanalysis==0.5.0 2>&1 | tail -2
    python3 -m pip install -q "protobuf>=7.35.1,<8" graphviz networkx pydot plotly 2>&1 | tail -2
    python3 -c "import chakra.src.trace_link.trace_linker; print('# chakra importable')" 2>&1 | tail -1
  fi
  for mode in ${MODES:-graph eager}; do
    extra=()
    if [[ $mode == eager ]]; then extra=(--chakra --speed "$EAGER_SPEED"); fi
    echo "\$ charllm-kit run ${ARGS[*]} ${extra[*]}"
    timeout 250 python3 -m kit run "${ARGS[@]}" "${extra[@]}" --out "$RUNS/$mode" 2>&1 \
      | grep -v -i warn | grep -E "^(status|step time|MFU|/)|rror"
    B=$(ls -d "$RUNS/$mode"/2* 2>/dev/null | tail -1)
    if [[ -z "$B" ]]; then echo "# $mode: no bundle"; continue; fi
    echo "\$ python3 benchmarks/profile/check_breakdown.py <the $mode bundle>"
    python3 benchmarks/profile/check_breakdown.py "$B" 2>&1 | grep -v -i warn
    echo "# check exit code: ${PIPESTATUS[0]}"
    ls -la "$B/profile" "$B/profile/chakra" 2>/dev/null
    cp "$B/profile/rank0.breakdown.json" "$OUT/breakdown-$mode-rank0.json" 2>/dev/null
    cp "$B/metrics.json" "$OUT/metrics-$mode.json"
    if [[ $mode == eager ]]; then
      keep "$B/profile/chakra/rank0.et" chakra-rank0.et.gz
      keep "$B/profile/chakra/rank0.host_et.json" host_et-rank0.json.gz
    fi
  done
} 2>&1 | tee -a "$OUT/profile-h100.txt"
