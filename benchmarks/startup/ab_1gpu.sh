#!/usr/bin/env bash
# Start-up of one change against a reference commit, on one GPU, in one device call (issue 34):
# `charllm-kit run gpt3-1.3b` (telemetry at 20 ms with the platform's full list, Zeus included,
# as a user runs it) from the reference tree and from this one, each with a fresh compile cache
# (cold) and then with the cache it filled (warm), interleaved (ref cold, this cold, ref warm,
# this warm, then the two warm runs again) so that neither tree meets a warmer host. Prints
# launch to the first step done and every lifecycle phase per run, and the medians of the warm
# runs per tree.
#   git archive -o .ab/ref.tar <commit>    # here: the reference tree, carried as .ab/
#   REF=.ab/ref.tar bash benchmarks/startup/ab_1gpu.sh
# Writes $OUT/<gpu>x1-startup-ab.txt (what it printed: date, device, versions, commands) and
# $OUT/<gpu>x1-startup-ab.json (each run: tree, cache state, status, lifecycle).
set -uo pipefail
cd "$(dirname "$0")/../.."
HERE=$PWD
export PYTHONUNBUFFERED=1
OUT="${OUT:-results/startup/out}"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
source benchmarks/lib.sh
use_carried_wheels
TAG="$(gpu_tag)"
REF="${REF:?set REF to a git archive (tar) of the reference commit}"
WORK=/tmp/startup-ab; rm -rf "$WORK"; mkdir -p "$WORK/ref" "$WORK/runs"
tar -xf "$REF" -C "$WORK/ref"
PLATFORM="${PLATFORM:-$(echo "$TAG" | cut -dx -f1)}" WORKLOAD="${WORKLOAD:-gpt3-1.3b}"
start_budget "${BUDGET_S:-500}"

one() {  # TREE(ref|this) CACHE-NAME LABEL
  local tree="$1" cache="$WORK/cache-$1" label="$3" dir
  dir=$([[ "$tree" == ref ]] && echo "$WORK/ref" || echo "$HERE")
  if (( $(left) < 60 )); then echo "## $label: not started, $(left) s left"; return; fi
  local cmd=(python3 -m kit run "$WORKLOAD" --platform "$PLATFORM" --micro-batch 2
             --global-batch 16 --steps 4 --warmup 2 --telemetry-interval-ms 20
             --compile-cache "$cache" --out "$WORK/runs" --json)
  echo "## $label ($tree)"; echo "\$ ${cmd[*]}"
  (cd "$dir" && PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" timeout --signal=TERM \
     --kill-after=15 "$(left 30)" "${cmd[@]}" > "$WORK/$label.out" 2> "$WORK/$label.err")
  echo "exit $?"
  python3 - "$tree" "$label" "$WORK/$label.out" "$WORK/runs.jsonl" <<'PY'
import json, sys
tree, label, answer, log = sys.argv[1:]
try:
    a = json.loads(open(answer).read().strip().splitlines()[-1])
except (OSError, ValueError, IndexError):
    a = {"error": "no JSON answer"}
life = a.get("lifecycle") or {}
entry = {"tree": tree, "label": label, "status": a.get("status"), "error": a.get("error"),
         "warm": (a.get("compile_cache") or {}).get("warm"), "lifecycle": life}
phases = " ".join(f"{k} {v:.1f}" for k, v in (life.get("phases_s") or {}).items()
                  if k in ("launcher", "rank_imports", "engine_imports", "process_groups",
                           "model_build", "first_step"))
print(f"  {a.get('status')}: launch to first step done {life.get('launch_to_first_step_end_s')} s"
      f" ({phases}); error {a.get('error')}")
open(log, "a").write(json.dumps(entry) + "\n")
PY
}

{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $(nproc) cores"
  python3 -c "from importlib.metadata import version as v; print('# torch', v('torch'), 'megatron-core', v('megatron-core'), 'zeus', v('zeus'))" 2>&1 | tail -1
  echo "# this tree: ${KIT_COMMIT:-unknown}; reference: ${REF_COMMIT:-$REF}; PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-}"
  # the page cache, not the compile cache: neither tree's first run reads the packages from disk
  python3 -c "import torch, megatron.core, sklearn, zeus" >/dev/null 2>&1
  one ref c ref-cold; one this c this-cold
  one ref c ref-warm1; one this c this-warm1
  one ref c ref-warm2; one this c this-warm2
  python3 - "$WORK/runs.jsonl" "$OUT/$TAG-startup-ab.json" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
json.dump(runs, open(sys.argv[2], "w"), indent=1)
print("tree  cold: launch to first step done | warm (median of 2) | warm first_step phase")
for tree in ("ref", "this"):
    cold = [r for r in runs if r["tree"] == tree and r["label"].endswith("cold")]
    warm = [r for r in runs if r["tree"] == tree and "warm" in r["label"] and r["lifecycle"]]
    c = cold[0]["lifecycle"].get("launch_to_first_step_end_s") if cold and cold[0]["lifecycle"] else None
    w = [r["lifecycle"]["launch_to_first_step_end_s"] for r in warm]
    f = [r["lifecycle"]["phases_s"]["first_step"] for r in warm]
    print(f"{tree:5} {c} s | {statistics.median(w) if w else None} s | "
          f"{statistics.median(f) if f else None} s")
PY
} 2>&1 | tee "$OUT/$TAG-startup-ab.txt"
