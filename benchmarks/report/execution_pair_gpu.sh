#!/usr/bin/env bash
# One configuration run graphed twice and eager once on this GPU node, then `charllm-kit compare`
# of the three: the graphed runs are repeats of one group, the eager run a group of its own, each
# named by its execution mode, with an `execution` comparability line (issue 58's like-for-like
# rule, applied to compare). One device call of about 3 minutes that resumes (a run whose bundle
# is already in results/execution-pair/ is not run again while the machine stays warm).
#   OUT=<dir> bash benchmarks/report/execution_pair_gpu.sh   (WORKLOAD: gpt3-1.3b unless set)
# Writes into $OUT: <gpu>x<N>-execution-pair.txt (date, device, commit, each run's last line, the
# compare table and its JSON groups) and bundles/ (the three bundles, whole).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source benchmarks/lib.sh
use_carried_wheels
OUT="${OUT:?}"; mkdir -p "$OUT/bundles"
TAG=$(gpu_tag)
RUNS=results/execution-pair; mkdir -p "$RUNS"
ARGS=("${WORKLOAD:-gpt3-1.3b}" --micro-batch 4 --global-batch 16 --steps 10 --warmup 3 --out "$RUNS")
run_one() {  # NAME [EXTRA...]: the run's bundle path in $RUNS/NAME.path
  local name=$1; shift
  if [[ -s "$RUNS/$name.path" ]]; then echo "# $name: kept from an earlier call"; return; fi
  echo "\$ charllm-kit run ${ARGS[*]} $*"
  python3 -m kit run "${ARGS[@]}" "$@" >"$RUNS/$name.out" 2>"$RUNS/$name.err"
  local rc=$?
  tail -3 "$RUNS/$name.out"; echo "# exit $rc"
  [[ $rc -eq 0 ]] && tail -1 "$RUNS/$name.out" >"$RUNS/$name.path"
}
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x${TAG##*x}," \
       "kit ${KIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  python3 -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__)" 2>&1 | tail -1
  run_one graphed-1
  run_one graphed-2
  run_one eager --eager
  bundles=()
  for name in graphed-1 graphed-2 eager; do
    [[ -s "$RUNS/$name.path" ]] && bundles+=("$(cat "$RUNS/$name.path")")
  done
  echo "\$ charllm-kit compare <graphed-1> <graphed-2> <eager>"
  python3 -m kit compare "${bundles[@]}"
  echo "# exit $?"
  echo "\$ charllm-kit compare ... --format json: each group's label, runs and figures"
  python3 -m kit compare "${bundles[@]}" --format json | python3 -c '
import json, sys
d = json.load(sys.stdin)
for g in d["groups"]:
    v = g["metrics"]
    print(json.dumps({"label": g["label"], "runs": len(g["bundles"]), **{k: v[k]["median"] for k
          in ("tokens_per_s", "step_time_s", "mfu", "power_w_mean", "energy_j_per_token")}}))
print(json.dumps({"checks": [c for c in d["checks"] if c["kind"] == "execution"]}))'
  for b in "${bundles[@]}"; do cp -r "$b" "$OUT/bundles/"; done
} 2>&1 | grep -v -iE '^\S*warn' | tee "$OUT/$TAG-execution-pair.txt"
