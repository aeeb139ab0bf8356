#!/usr/bin/env bash
# Where the seconds before the first step go on a GPU host (issue 34): py-spy samples every
# process of `charllm-kit run` (launcher, sampler, ranks) from launch to exit, twice: a cold
# compile cache (CHARLLM_COMPILE_CACHE: a fresh folder) and the
# warm one it filled. Writes $OUT/pyspy-<n>.txt (collapsed stacks, py-spy's raw format) and
# $OUT/first-step.txt (the runs' lifecycle lines). Summarise on any host with
#   python3 benchmarks/startup/pyspy_summary.py $OUT/pyspy-2.txt
# With this workplace's device tool, carry .whl/ (py-spy's wheel among them).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:?set OUT}"; mkdir -p "$OUT"
if ! python3 -c "import megatron.core, pydantic" >/dev/null 2>&1 && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH="/tmp/site:$PYTHONPATH" PATH="/tmp/site/bin:$PATH"
fi
WL="${WL:-gpt3-1.3b}"
exec > >(tee -a "$OUT/first-step.txt") 2>&1
echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); kit ${KIT_COMMIT:-unknown}"
export CHARLLM_COMPILE_CACHE="/tmp/fs-cache-$$"  # cold for run 1, warm for run 2
for n in 1 2; do
  echo "## run $n ($([ $n = 1 ] && echo cold || echo warm) compile cache): py-spy record -r 100 -s --idle -f raw -- charllm-kit run $WL --steps 2 --warmup 1"
  py-spy record -r 100 -s -t --idle -f raw -o "$OUT/pyspy-$n.txt" -- python3 -m kit run "$WL" \
    --micro-batch 2 --global-batch 16 --steps 2 --warmup 1 --min-measured-s 0 --out /tmp/fs 2>&1 \
    | grep -E "launch to first step|compile cache|^status|py-spy|Error|error" 
done
echo "# done in ${SECONDS}s"
