#!/usr/bin/env bash
# Issues 38 and 58: `charllm-kit study` on this GPU node, in one device call under 9 minutes
# that resumes.
#   benchmarks/study/study_gpu.sh quick   the --quick form (one H100: about 2 min by its
#                                         estimate; 4 H200s: about 6 min)
#   benchmarks/study/study_gpu.sh full    the whole study (4 H200s: about 10 min): call it again
#                                         while the machine is warm and it resumes where it stopped
#   benchmarks/study/study_gpu.sh plan    only the dry run of both forms (no GPU time; without
#                                         nvidia-smi, e.g. to check this script: one H100's)
# The study folder lives in results/study/ (it persists while the machine stays warm). Each call
# writes into $OUT:
#   <gpu>x<N>-study-console.txt (quick; full: <gpu>x<N>-study-full-console.txt): what it
#     printed, with date, device and commit, and last the estimate against the wall time;
#   once the study concluded, <gpu>x<N>-findings.json (its `matrix` object: each finding's
#     execution mode, the warm-up checks, the estimate and the wall time), report.html with
#     findings/ (the report's Findings figures) and report_figures/ when the report writes
#     figures beside it, and bundles-<gpu>x<N>-study-<form>.tar.gz (each bundle's manifest.json,
#     metrics.json and steps.parquet, the sweep index and the matrix).
# STUDY_BUDGET_S (default 480) bounds the study's run: at the end of it the kit stops the
# running point (SIGINT, its bundle says interrupted), writes the findings so far and says that
# --resume continues; with the header and the archive the call stays under 9 minutes.
set -uo pipefail
FORM="${1:-quick}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/study/out}"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
source benchmarks/lib.sh
RESULTS=results/study
BUDGET="${STUDY_BUDGET_S:-480}"
if command -v nvidia-smi >/dev/null 2>&1; then
  use_carried_wheels
  TAG=$(gpu_tag); NODE=()
else  # no GPU here: the plan form shows one H100's matrix
  [[ "$FORM" == plan ]] || { echo "no nvidia-smi: only the plan form runs here"; exit 2; }
  TAG=h100x1; NODE=(--platform h100 --devices 1)
fi
NGPUS=${TAG##*x}
header() {
  if [[ ${#NODE[@]} -eq 0 ]]; then
    echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$NGPUS, driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
    python3 -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__)" 2>&1 | tail -1
  else
    echo "# $(date -u +%FT%TZ) no GPU here: the dry run for ${NODE[*]}"
  fi
  # KIT_COMMIT: the commit the tree was copied from, where the copy's own git history is not it
  echo "# kit commit: ${KIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
}
seconds_of() {  # "1 min 51 s" or "45 s" -> seconds
  sed -E 's/^([0-9]+) min ([0-9]+) s$/\1 \2/; s/^([0-9]+) s$/0 \1/' <<<"$1" \
    | awk '{print $1 * 60 + $2}'
}
run_form() {  # quick|full
  local args=(); [[ "$1" == quick ]] && args=(--quick)
  local plan; plan=$(python3 -m kit study "${args[@]}" --out "$RESULTS" --dry-run)
  local name; name=$(head -1 <<<"$plan" | sed -E 's/^study ([^:]+):.*/\1/')
  local folder="$RESULTS/$name" resume=()
  [[ -f "$folder/sweep.json" ]] && resume=(--resume)
  echo "\$ charllm-kit study ${args[*]} --out $RESULTS --dry-run"
  echo "$plan"
  local estimate; estimate=$(grep -oE 'estimated ([0-9]+ min )?[0-9]+ s' <<<"$plan" | tail -1 \
    | sed 's/^estimated //')
  echo "\$ charllm-kit study ${args[*]} --out $RESULTS ${resume[*]}"
  local t0; t0=$(date +%s.%N)
  timeout --signal=INT "$BUDGET" python3 -m kit study "${args[@]}" --out "$RESULTS" "${resume[@]}" 2>&1 \
    | grep -v -iE 'warn|^\s*$'
  local rc=${PIPESTATUS[0]} wall; wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}')
  echo "# exit $rc at $(date -u +%FT%TZ)"
  local est_s; est_s=$(seconds_of "$estimate")
  echo "# estimate $estimate ($est_s s), wall time of the study command ${wall} s" \
       "($(awk -v w="$wall" -v e="$est_s" 'BEGIN {printf "%+.0f%%", (w / e - 1) * 100}') against the estimate)" \
       "${resume[*]:+(resumed: points kept from an earlier call took no time)}"
  [[ -f "$folder/$TAG-findings.json" ]] || return 0
  cp "$folder/$TAG-findings.json" "$OUT/"
  cp "$folder/report.html" "$OUT/" 2>/dev/null
  for d in findings report_figures; do [[ -d "$folder/$d" ]] && cp -r "$folder/$d" "$OUT/"; done
  (cd "$folder" && find . \( -name manifest.json -o -name metrics.json -o -name steps.parquet \
     -o -name sweep.json -o -name matrix.yaml -o -name fabric.json \) -not -path '*.partial*' \
     -print0 | tar --null -czf "$OUT/bundles-$TAG-study-$1.tar.gz" -T -)
}
case "$FORM" in
  quick) LOG="$OUT/$TAG-study-console.txt" ;;
  full|plan) LOG="$OUT/$TAG-study-$FORM-console.txt" ;;
  *) echo "unknown form $FORM (quick, full, plan)"; exit 2 ;;
esac
{
  header
  case "$FORM" in
    quick|full) run_form "$FORM" ;;
    plan) for f in "" --quick; do
            echo "\$ charllm-kit study $f ${NODE[*]} --out $RESULTS --dry-run"
            python3 -m kit study $f "${NODE[@]}" --out "$RESULTS" --dry-run
          done ;;
  esac
} 2>&1 | tee "$LOG"
