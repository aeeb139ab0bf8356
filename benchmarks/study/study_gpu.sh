#!/usr/bin/env bash
# Issue 38: `charllm-kit study` on this GPU node, in one 10-minute device call that resumes.
#   benchmarks/study/study_gpu.sh quick   the --quick form (4 H200s: about 6 min by its estimate)
#   benchmarks/study/study_gpu.sh full    the whole study (4 H200s: about 10 min): call it again
#                                         while the machine is warm and it resumes where it stopped
#   benchmarks/study/study_gpu.sh plan    only the dry run of both forms (no GPU time)
# The study folder lives in results/study/ (it persists while the machine stays warm). Each call
# writes into $OUT: <gpu>x<N>-study-<form>.txt (what it printed, with date, device and commit),
# and once the study concluded: <gpu>x<N>-findings.json, report.html with findings/ (the
# report's Findings figures) and report_figures/ when the report writes figures beside it, and
# bundles-<gpu>x<N>-study-<form>.tar.gz (each bundle's manifest.json and metrics.json, the
# sweep index and the matrix). STUDY_BUDGET_S (default 540) bounds the study's run: at the end
# of it the kit stops the running point (SIGINT, its bundle says interrupted), writes the
# findings so far and says that --resume continues.
set -uo pipefail
FORM="${1:-quick}"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/study/out}"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
source benchmarks/lib.sh
TAG=$(gpu_tag); NGPUS=${TAG##*x}
RESULTS=results/study
BUDGET="${STUDY_BUDGET_S:-540}"
header() {
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$NGPUS, driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  python3 -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__)" 2>&1 | tail -1
  # KIT_COMMIT: the commit the tree was copied from, where the copy's own git history is not it
  echo "# kit commit: ${KIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
}
run_form() {  # quick|full
  local args=(); [[ "$1" == quick ]] && args=(--quick)
  local name; name=$(python3 -m kit study "${args[@]}" --dry-run | head -1 | sed -E 's/^study ([^:]+):.*/\1/')
  local folder="$RESULTS/$name" resume=()
  [[ -f "$folder/sweep.json" ]] && resume=(--resume)
  echo "\$ charllm-kit study ${args[*]} --dry-run"
  python3 -m kit study "${args[@]}" --dry-run
  echo "\$ charllm-kit study ${args[*]} --out $RESULTS ${resume[*]}"
  timeout --signal=INT "$BUDGET" python3 -m kit study "${args[@]}" --out "$RESULTS" "${resume[@]}" 2>&1 \
    | grep -v -iE 'warn|^\s*$'
  echo "# exit ${PIPESTATUS[0]} at $(date -u +%FT%TZ)"
  [[ -f "$folder/$TAG-findings.json" ]] || return 0
  cp "$folder/$TAG-findings.json" "$OUT/"
  cp "$folder/report.html" "$OUT/" 2>/dev/null
  for d in findings report_figures; do [[ -d "$folder/$d" ]] && cp -r "$folder/$d" "$OUT/"; done
  (cd "$folder" && find . \( -name manifest.json -o -name metrics.json -o -name sweep.json \
     -o -name matrix.yaml -o -name fabric.json \) -not -path '*.partial*' -print0 \
     | tar --null -czf "$OUT/bundles-$TAG-study-$1.tar.gz" -T -)
}
{
  header
  case "$FORM" in
    quick|full) run_form "$FORM" ;;
    plan) for f in "" --quick; do echo "\$ charllm-kit study $f --dry-run"; python3 -m kit study $f --dry-run; done ;;
    *) echo "unknown form $FORM (quick, full, plan)"; exit 2 ;;
  esac
} 2>&1 | tee "$OUT/$TAG-study-$FORM.txt"
