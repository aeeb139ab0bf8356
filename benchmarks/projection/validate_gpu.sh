#!/usr/bin/env bash
# Issue 29's calibration on one 4-GPU H100/H200 machine, in one device call (about 8 minutes):
#   OUT=... [MEASURED=DIR] [BUDGET_S=450] bash benchmarks/projection/validate_gpu.sh
#   CPU=1 OUT=... bash benchmarks/projection/validate_gpu.sh   # the same flow on gloo (a dry run)
# (a) the inputs, measured here: gpt3-1.3b, micro-batch 2, global batch 16 on ONE GPU, profiled,
#     twice: the default step (one CUDA graph) and the eager step the multi-GPU layouts run (the
#     default features less cuda_graph; its phase timers give the optimizer's time); then
#     `fabric --nproc N` over all N GPUs and, while the budget lasts, `--nproc 2`.
# (b) predict.py: the 2- and 4-GPU points (DP2, DP4, TP2+SP, TP4+SP, PP2, PP4, TP2xPP2+SP), or
#     with MEASURED=DIR one prediction per bundle found there, at its own layout.
# (c) the measurements: MEASURED=DIR, else the points measured here while BUDGET_S lasts.
# (d) validate.py: the table (predicted, measured, error) and validation-<gpu>x<N>.json.
# $OUT: validate-<gpu>x<N>.log (all printed), validation-<gpu>x<N>.{txt,json}, inputs.tar.gz
# (the input bundles packed with `bundle pack`, the projection files) and, when measured here,
# measured.tar.gz (those bundles' manifest, metrics and breakdowns): predict.py and validate.py
# rerun on them anywhere. Exit 1 only when no point could be compared.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:?set OUT to the folder for the results}"; mkdir -p "$OUT"
BUDGET_S="${BUDGET_S:-450}"
WORK="${WORK:-/tmp/projection-validate}"; rm -rf "$WORK"; mkdir -p "$WORK"/{src,pred,measured}
HERE=benchmarks/projection

if [ "${CPU:-0}" = 1 ]; then
  GPU=cpu; NGPU=2; WL=gpt3-tiny; GBS=8; STEPS=(--steps 6 --warmup 2); PROFILE=(--profile-steps 3:5)
else
  GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i 'h[12]00' \
        | tr 'A-Z' 'a-z')
  NGPU=$(nvidia-smi -L | wc -l); WL=gpt3-1.3b; GBS=16
  STEPS=(--steps 12 --warmup 3); PROFILE=(--profile-steps 8:10)
fi
TAG="${GPU}x${NGPU}"
exec > >(tee -a "$OUT/validate-$TAG.log") 2>&1
left() { echo $((BUDGET_S - SECONDS)); }

echo "# $(date -u +%FT%TZ) $TAG: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'no GPU (CPU=1)')"
python3 -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__)" 2>&1 | tail -1
echo "# kit commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) (a device copy's metadata may be stale)"
if [ -z "$GPU" ]; then echo "error: no H100 or H200 here"; exit 1; fi

# Runs on part of the host: does the kit see one GPU under CUDA_VISIBLE_DEVICES=0?
PARTIAL=cut
if [ "$GPU" != cpu ]; then
  SEEN=$(CUDA_VISIBLE_DEVICES=0 python3 -c \
    "from kit.spec.detect import local_accelerator_names as f; print(len(f()))" 2>/dev/null)
  if [ "$SEEN" = 1 ]; then
    PARTIAL=native; echo "# the kit honours CUDA_VISIBLE_DEVICES (sees 1 GPU under =0)"
  else
    echo "# the kit sees ${SEEN:-?} GPUs under CUDA_VISIBLE_DEVICES=0: runs on part of the host use"
    echo "# platforms/$GPU.yaml cut to that many devices ($WORK/plat/<n>/$GPU.yaml)"
  fi
fi
platform_for() {  # GPUs -> the --platform a run on the first n GPUs takes
  local n=$1 f="$WORK/plat/$1/$GPU.yaml"
  if [ "$GPU" = cpu ] || [ "$n" = "$NGPU" ] || [ "$PARTIAL" = native ]; then echo "$GPU"; return; fi
  [ -f "$f" ] || python3 - "$GPU" "$n" "$f" <<'EOF'
import sys
from pathlib import Path
import yaml
name, n, path = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
spec = yaml.safe_load(Path(f"platforms/{name}.yaml").read_text())
spec["devices_per_node"] = n
spec["chassis"] = [c for c in spec.get("chassis", []) if c["device"] < n]
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(yaml.safe_dump(spec, sort_keys=False))
EOF
  echo "$f"
}
visible() { [ "$GPU" = cpu ] && echo "" || seq -s, 0 $(($1 - 1)); }
kit_run() {  # GPUS OUTDIR ARGS...: one run on the first GPUS devices; prints its bundle
  local n=$1 out=$2; shift 2
  echo "\$ CUDA_VISIBLE_DEVICES=$(visible "$n") charllm-kit run $WL --platform $(platform_for "$n") $*" >&2
  CUDA_VISIBLE_DEVICES=$(visible "$n") python3 -m kit run "$WL" --platform "$(platform_for "$n")" \
    --micro-batch 2 --global-batch "$GBS" --telemetry-interval-ms 20 --out "$out" "$@" \
    2>&1 | grep -v -i warn | tail -12 >&2
  ls -dt "$out"/2* 2>/dev/null | head -1
}

echo "## (a) inputs: one GPU, profiled; the fabric"
GRAPH=$(kit_run 1 "$WORK/src" --dp 1 "${STEPS[@]}" "${PROFILE[@]}")
EAGER_SPEED=$(python3 -c "from kit.engines.megatron.speed import DEFAULT; print(','.join(sorted(DEFAULT - {'cuda_graph'})))")
if [ "$GPU" = cpu ]; then EAGER=""; else
  EAGER=$(kit_run 1 "$WORK/src" --dp 1 "${STEPS[@]}" "${PROFILE[@]}" --speed "$EAGER_SPEED")
  [ "$EAGER" = "$GRAPH" ] && EAGER=""
fi
echo "\$ charllm-kit fabric --nproc $NGPU"
python3 -m kit fabric --nproc "$NGPU" --out "$WORK/src" 2>&1 | grep -v -i warn | tail -60
if [ "$NGPU" -gt 2 ] && { [ -n "${MEASURED:-}" ] || [ "$(left)" -gt 240 ]; }; then
  echo "\$ CUDA_VISIBLE_DEVICES=0,1 charllm-kit fabric --nproc 2 --platform $(platform_for 2)"
  CUDA_VISIBLE_DEVICES=0,1 python3 -m kit fabric --nproc 2 --platform "$(platform_for 2)" \
    --out "$WORK/src" 2>&1 | grep -v -i warn | tail -30
fi
INPUTS=$(ls -d "$WORK"/src/2*)
echo "inputs: $(echo $INPUTS | xargs -n1 basename | tr '\n' ' ')"

FULL_PLATFORM=()
[ "$GPU" != cpu ] && FULL_PLATFORM=(--platform "$GPU")
if [ -n "${MEASURED:-}" ]; then
  echo "## (b) predictions for the bundles in $MEASURED"
  python3 $HERE/predict.py --out "$WORK/pred" "${FULL_PLATFORM[@]}" --like "$MEASURED" $INPUTS
  MEAS_DIR="$MEASURED"
else
  if [ "$GPU" = cpu ]; then
    echo "## (c) measured here first (CPU=1: the points are the CPU's dp2 and tp2-sp)"
    kit_run 2 "$WORK/measured/dp2" --dp 2 "${STEPS[@]}" --profile-steps 1 >/dev/null
    kit_run 2 "$WORK/measured/tp2-sp" --tp 2 --sp "${STEPS[@]}" --profile-steps 1 >/dev/null
    echo "## (b) predictions"
    python3 $HERE/predict.py --out "$WORK/pred" --like "$WORK/measured" $INPUTS
  else
    echo "## (b) predictions for the 2- and 4-GPU points"
    python3 $HERE/predict.py --out "$WORK/pred" "${FULL_PLATFORM[@]}" $INPUTS
    echo "## (c) the points measured here while the budget lasts ($(left) s left)"
    for name in dp4 tp2-sp pp4 tp4-sp dp2 pp2 tp2xpp2-sp; do
      if [ "$(left)" -lt 75 ]; then echo "budget spent: $name and the rest not measured"; break; fi
      read -r n FLAGS < <(python3 -c "import sys; sys.path.insert(0, '$HERE')
from points import POINTS, run_flags
n, f = POINTS['$name']; print(n, ' '.join(run_flags(f)))")
      [ "$n" -gt "$NGPU" ] && continue
      # shellcheck disable=SC2086
      kit_run "$n" "$WORK/measured/$name" $FLAGS --steps 10 --warmup 4 --profile-steps 3 >/dev/null
    done
  fi
  MEAS_DIR="$WORK/measured"
fi

echo "## (d) predicted vs measured"
python3 $HERE/validate.py "$WORK/pred" "$MEAS_DIR" --out "$OUT" --tag "$TAG"
STATUS=$?

PACKED="$WORK/packed"; mkdir -p "$PACKED"
for b in $INPUTS; do python3 -m kit bundle pack "$b" -o "$PACKED/$(basename "$b").tar.gz" >/dev/null; done
cp -r "$WORK/pred" "$PACKED/pred"
tar -C "$PACKED" -czf "$OUT/inputs.tar.gz" .
if [ -z "${MEASURED:-}" ] && ls "$WORK"/measured/*/2* >/dev/null 2>&1; then
  (cd "$WORK/measured" && find . \( -name manifest.json -o -name metrics.json \
     -o -name '*.breakdown.json' \) -print0 | tar --null -czf "$OUT/measured.tar.gz" -T -)
fi
ls -la "$OUT"
echo "# done in ${SECONDS}s"
exit $STATUS
