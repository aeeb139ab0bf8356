#!/usr/bin/env bash
# Issue 37's calibration on one 4-GPU H100/H200 machine, in one 10-minute device call:
#   OUT=... [WORK=DIR] [BUDGET_S=450] [SOURCE=inputs.tar.gz] [MEASURED=DIR] \
#     bash benchmarks/projection/validate_gpu.sh
#   CPU=1 OUT=... bash benchmarks/projection/validate_gpu.sh   # the same flow on gloo (a dry run)
# (0) this GPU kind's GEMM table (`charllm-kit platforms gemm`: gpt3-1.3b and gpt3-175b's layer
#     GEMMs at TP 1, 2, 4, 8 and micro-batch 1, 2; well under a minute).
# (a) the inputs, measured here (unless SOURCE): gpt3-1.3b, micro-batch 2, global batch 16 on ONE
#     GPU, profiled, twice (the default step, one CUDA graph, and the eager step the multi-GPU
#     layouts run), and eager with TP2+SP on two GPUs (the eager TP host work of TP2 x PP2);
#     gpt3-175b's architecture with one layer (gpt3-175b-1l) on one GPU, micro-batch
#     1, profiled; `fabric --nproc N` and, while the budget lasts, `--nproc 2`.
#     SOURCE=inputs.tar.gz (this script's inputs.tar.gz from ANOTHER GPU kind): its bundles and
#     GEMM table are the inputs instead, and this machine gives only its own GEMM table: the
#     points are predicted across kinds (docs/projection.md) and measured here. A source from a
#     one-GPU host has no fabric: the target then measures its own links (said in the log).
#     On ONE GPU: no fabric, no points: the GEMM table and the inputs (another kind's SOURCE).
# (b) predict.py: the 8 points (points.POINTS: DP2, DP4, TP2+SP, TP4+SP, PP2, PP4, TP2xPP2+SP,
#     gpt3-175b-4l TP2+SP x DP2), or with MEASURED=DIR one per bundle found there.
# (c) the points measured here in points.ORDER while BUDGET_S lasts (MEASURED=DIR: none).
# (d) validate.py: the table and validation-<gpu>x<N>[-from-<kind>].json (source_kind per point).
# (e) same kind only: gpt3-175b at full depth projected onto this kind's study cluster (H100:
#     8 nodes x 8, TP8 x PP8; H200: 4 nodes x 8, TP8 x PP4) and, where the other kind's GEMM
#     table exists (OTHER_TABLE, default platforms/<other>.gemm.json), onto the other's, into
#     $OUT/scale/.
# Every step skips what an earlier call with the same WORK (default /tmp/projection-validate)
# already finished, so a second call resumes the points the first ran out of time for.
# $OUT: validate-<tag>.log (all printed), validation-<tag>.{txt,json}, <gpu>.gemm.json,
# inputs.tar.gz (the input bundles as `bundle pack` archives, the GEMM table(s), the projection
# files), measured.tar.gz (the measured bundles' manifest, metrics and breakdowns), scale/.
# Exit 1 only when no point could be compared.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:?set OUT to the folder for the results}"; mkdir -p "$OUT"
BUDGET_S="${BUDGET_S:-450}"
WORK="${WORK:-/tmp/projection-validate}"; mkdir -p "$WORK"/{src,pred,measured,wl}
HERE=benchmarks/projection

if [ "${CPU:-0}" = 1 ]; then
  GPU=cpu; NGPU=2; WL=gpt3-tiny; GBS=8; STEPS=(--steps 6 --warmup 2); PROFILE=(--profile-steps 3:5)
  GEMM_ARGS=(--workload gpt3-tiny --tp 1,2 --micro-batch 2 --min-time-ms 2)
else
  GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i 'h[12]00' \
        | tr 'A-Z' 'a-z')
  NGPU=$(nvidia-smi -L | wc -l); WL=gpt3-1.3b; GBS=16
  STEPS=(--steps 10 --warmup 3); PROFILE=(--profile-steps 6:8)
  GEMM_ARGS=(--workload gpt3-1.3b --workload gpt3-175b-4l --tp 1,2,4,8 --micro-batch 1,2)
fi
TAG="${GPU}x${NGPU}"
exec > >(tee -a "$OUT/validate-$TAG.log") 2>&1
source benchmarks/lib.sh
start_budget "$BUDGET_S"
have() { ls "$1"/2*/manifest.json >/dev/null 2>&1; }  # a finished bundle there (resume)
bundles_in() {  # the bundles among the paths that ended ok (a failed input would stop project)
  python3 - "$@" <<'PY'
import json, sys
from pathlib import Path
for d in sys.argv[1:]:
    try:
        if json.loads((Path(d) / "manifest.json").read_text())["status"] == "ok":
            print(d)
    except (OSError, ValueError, KeyError):
        pass
PY
}

echo "# $(date -u +%FT%TZ) $TAG: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'no GPU (CPU=1)')"
python3 -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__)" 2>&1 | tail -1
echo "# kit commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) (a device copy's metadata may be stale); WORK=$WORK"
if [ -z "$GPU" ]; then echo "error: no H100 or H200 here"; exit 1; fi

# Runs on part of the host: does the kit see one GPU under CUDA_VISIBLE_DEVICES=0?
PARTIAL=cut
if [ "$GPU" != cpu ]; then
  SEEN=$(CUDA_VISIBLE_DEVICES=0 python3 -c \
    "from kit.telemetry.devices import local_accelerator_names as f; print(len(f()))" 2>/dev/null)
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
  [ -f "$f" ] || python3 - "$GPU" "$n" "$f" <<'PY'
import sys
from pathlib import Path
import yaml
name, n, path = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
spec = yaml.safe_load(Path(f"platforms/{name}.yaml").read_text())
spec["devices_per_node"] = n
spec["chassis"] = [c for c in spec.get("chassis", []) if c["device"] < n]
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(yaml.safe_dump(spec, sort_keys=False))
PY
  echo "$f"
}
visible() { [ "$GPU" = cpu ] && echo "" || seq -s, 0 $(($1 - 1)); }
kit_run() {  # GPUS OUTDIR WORKLOAD ARGS...: one run on the first GPUS devices; prints its bundle
  local n=$1 out=$2 wl=$3; shift 3
  echo "\$ CUDA_VISIBLE_DEVICES=$(visible "$n") charllm-kit run $wl --platform $(platform_for "$n") $*" >&2
  CUDA_VISIBLE_DEVICES=$(visible "$n") python3 -m kit run "$wl" --platform "$(platform_for "$n")" \
    --telemetry-interval-ms 20 --out "$out" "$@" 2>&1 | grep -v -i warn | tail -12 >&2
  ls -dt "$out"/2* 2>/dev/null | head -1
}

echo "## (0) the GEMM table of $GPU"
TABLE="$WORK/src/$GPU.gemm.json"
if [ ! -f "$TABLE" ]; then
  echo "\$ charllm-kit platforms gemm --platform $GPU ${GEMM_ARGS[*]} -o $TABLE"
  CUDA_VISIBLE_DEVICES=$(visible 1) python3 -m kit platforms gemm --platform "$GPU" \
    "${GEMM_ARGS[@]}" -o "$TABLE" 2>&1 | grep -v -i warn | tail -3
fi
cp "$TABLE" "$OUT/" 2>/dev/null

SRCKIND=$GPU
if [ -n "${SOURCE:-}" ]; then
  echo "## (a) inputs from $SOURCE (another GPU kind)"
  S="$WORK/source"; mkdir -p "$S/raw" "$S/bundles"
  [ -d "$S/raw/pred" ] || tar -C "$S/raw" -xzf "$SOURCE"
  for a in "$S"/raw/*.tar.gz; do
    [ -d "$S/bundles/$(basename "$a" .tar.gz)" ] || python3 -m kit bundle unpack "$a" -o "$S/bundles" >/dev/null
  done
  SRC_TABLE=$(ls "$S"/raw/*.gemm.json 2>/dev/null | head -1)
  SRCKIND=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['platform'])" "$SRC_TABLE")
  INPUTS="$(bundles_in "$S"/bundles/2* | tr '\n' ' ') $SRC_TABLE"
  [ "$SRCKIND" != "$GPU" ] && INPUTS="$INPUTS $TABLE"  # this kind's own table: the target's
  if ! ls -d "$S"/bundles/*-fabric-* >/dev/null 2>&1 && [ "$NGPU" -gt 1 ]; then
    # A one-GPU source host measured no links: this machine's fabric stands in (the projection
    # lists it among what it rests on; compute still comes from the source kind alone).
    echo "the source carries no fabric bundle (a one-GPU host): this machine's links are measured"
    have "$WORK/src/fabric" || python3 -m kit fabric --nproc "$NGPU" --out "$WORK/src/fabric" \
      2>&1 | grep -v -i warn | tail -3
    INPUTS="$INPUTS $(bundles_in "$WORK"/src/fabric/2* | head -1)"
  fi
  TAG="${TAG}-from-${SRCKIND}"
  rm -rf "$WORK/pred"; mkdir -p "$WORK/pred"  # predictions from the source, not this kind's
else
  echo "## (a) inputs: one GPU, profiled; the fabric"
  have "$WORK/src/graph" || kit_run 1 "$WORK/src/graph" "$WL" --dp 1 --micro-batch 2 \
    --global-batch "$GBS" "${STEPS[@]}" "${PROFILE[@]}" >/dev/null
  if [ "$GPU" != cpu ]; then
    EAGER_SPEED=$(python3 -c "from kit.engines.megatron.speed import DEFAULT; print(','.join(sorted(DEFAULT - {'cuda_graph'})))")
    have "$WORK/src/eager" || kit_run 1 "$WORK/src/eager" "$WL" --dp 1 --micro-batch 2 \
      --global-batch "$GBS" "${STEPS[@]}" "${PROFILE[@]}" --speed "$EAGER_SPEED" >/dev/null
    # the eager TP2+SP step on two GPUs: the host work of eager TP inside a pipeline
    # (TP2 x PP2), which no one-GPU run measures; project chooses it for eager TP2 targets
    have "$WORK/src/eager-tp2" || kit_run 2 "$WORK/src/eager-tp2" "$WL" --tp 2 --sp \
      --micro-batch 2 --global-batch "$GBS" "${STEPS[@]}" "${PROFILE[@]}" \
      --speed "$EAGER_SPEED" >/dev/null
    STUDY="$WORK/wl/gpt3-175b-1l.yaml"
    [ -f "$STUDY" ] || python3 - "$STUDY" <<'PY'
import sys
from pathlib import Path
import yaml
spec = yaml.safe_load(Path("workloads/gpt3-175b.yaml").read_text())
spec.update(name="gpt3-175b-1l", num_layers=1,
            description="gpt3-175b's architecture with one layer: its source on one GPU")
spec.pop("scaling", None)
Path(sys.argv[1]).write_text(yaml.safe_dump(spec, sort_keys=False))
PY
    have "$WORK/src/study" || kit_run 1 "$WORK/src/study" "$STUDY" --dp 1 --micro-batch 1 \
      --global-batch 8 --steps 8 --warmup 3 --profile-steps 5:7 >/dev/null
  fi
  if [ "$NGPU" -lt 2 ]; then
    echo "one GPU: no fabric here (a collective needs 2 ranks); a target with links measures its own"
  elif ! have "$WORK/src/fabric"; then
    echo "\$ charllm-kit fabric --nproc $NGPU"
    python3 -m kit fabric --nproc "$NGPU" --out "$WORK/src/fabric" 2>&1 | grep -v -i warn | tail -40
  fi
  if [ "$NGPU" -gt 2 ] && ! have "$WORK/src/fabric2" && [ "$(left)" -gt 360 ]; then
    echo "\$ CUDA_VISIBLE_DEVICES=0,1 charllm-kit fabric --nproc 2 --platform $(platform_for 2)"
    CUDA_VISIBLE_DEVICES=0,1 python3 -m kit fabric --nproc 2 --platform "$(platform_for 2)" \
      --out "$WORK/src/fabric2" 2>&1 | grep -v -i warn | tail -20
  fi
  INPUTS="$(bundles_in "$WORK"/src/*/2* | tr '\n' ' ') $TABLE"
fi
echo "inputs: $(echo $INPUTS | xargs -n1 basename | tr '\n' ' ')"

FULL_PLATFORM=()
[ "$GPU" != cpu ] && FULL_PLATFORM=(--platform "$GPU")
if [ -n "${MEASURED:-}" ]; then
  echo "## (b) predictions for the bundles in $MEASURED"
  # shellcheck disable=SC2086
  python3 $HERE/predict.py --out "$WORK/pred" "${FULL_PLATFORM[@]}" --like "$MEASURED" $INPUTS
  MEAS_DIR="$MEASURED"
else
  if [ "$GPU" = cpu ]; then
    echo "## (c) measured here first (CPU=1: the points are the CPU's dp2 and tp2-sp)"
    have "$WORK/measured/dp2" || kit_run 2 "$WORK/measured/dp2" "$WL" --dp 2 --micro-batch 2 \
      --global-batch "$GBS" "${STEPS[@]}" --profile-steps 1 >/dev/null
    have "$WORK/measured/tp2-sp" || kit_run 2 "$WORK/measured/tp2-sp" "$WL" --tp 2 --sp \
      --micro-batch 2 --global-batch "$GBS" "${STEPS[@]}" --profile-steps 1 >/dev/null
    echo "## (b) predictions"
    # shellcheck disable=SC2086
    python3 $HERE/predict.py --out "$WORK/pred" --like "$WORK/measured" $INPUTS
  else
    echo "## (b) predictions for the points"
    # shellcheck disable=SC2086
    python3 $HERE/predict.py --out "$WORK/pred" "${FULL_PLATFORM[@]}" $INPUTS
    echo "## (c) the points measured here while the budget lasts ($(left) s left)"
    for name in $(python3 -c "import sys; sys.path.insert(0, '$HERE'); from points import ORDER; print(*ORDER)"); do
      have "$WORK/measured/$name" && { echo "$name: measured by an earlier call"; continue; }
      if [ "$(left)" -lt 90 ]; then echo "budget spent: $name and the rest not measured (call again with WORK=$WORK)"; break; fi
      read -r n ARGS < <(python3 $HERE/points.py "$name")
      [ "$n" -gt "$NGPU" ] && continue
      # shellcheck disable=SC2086
      kit_run "$n" "$WORK/measured/$name" $ARGS --steps 8 --warmup 3 --profile-steps 3 >/dev/null
    done
  fi
  MEAS_DIR="$WORK/measured"
fi

echo "## (d) predicted vs measured"
python3 $HERE/validate.py "$WORK/pred" "$MEAS_DIR" --out "$OUT" --tag "$TAG"
STATUS=$?

if [ "$GPU" != cpu ] && [ -z "${SOURCE:-}" ] && have "$WORK/src/study" && have "$WORK/src/fabric"; then
  echo "## (e) gpt3-175b (full depth) on the study's $GPU cluster"
  mkdir -p "$OUT/scale"
  if [ "$GPU" = h100 ]; then SHAPE=(--nodes 8 --tp 8 --pp 8); else SHAPE=(--nodes 4 --tp 8 --pp 4); fi
  FAB=$(bundles_in "$WORK"/src/fabric/2* | head -1)
  echo "\$ charllm-kit project <gpt3-175b-1l run> <fabric> $GPU.gemm.json --workload gpt3-175b --platform $GPU ${SHAPE[*]} --sp --micro-batch 1 --global-batch 128 --recompute full --dist-optimizer"
  python3 -m kit project "$(bundles_in "$WORK"/src/study/2* | head -1)" "$FAB" "$TABLE" --workload gpt3-175b \
    --platform "$GPU" "${SHAPE[@]}" --sp --micro-batch 1 --global-batch 128 --recompute full \
    --dist-optimizer --out "$OUT/scale" 2>&1 | tail -60
  if [ "$GPU" = h100 ]; then OTHER=h200; OSHAPE=(--nodes 4 --tp 8 --pp 4); else OTHER=h100; OSHAPE=(--nodes 8 --tp 8 --pp 8); fi
  OTHER_TABLE="${OTHER_TABLE:-platforms/$OTHER.gemm.json}"
  if [ -f "$OTHER_TABLE" ]; then
    echo "\$ charllm-kit project <gpt3-175b-1l run> <fabric> $GPU.gemm.json $OTHER_TABLE --workload gpt3-175b --platform $OTHER ${OSHAPE[*]} --sp --micro-batch 1 --global-batch 128 --recompute full --dist-optimizer"
    python3 -m kit project "$(bundles_in "$WORK"/src/study/2* | head -1)" "$FAB" "$TABLE" "$OTHER_TABLE" \
      --workload gpt3-175b --platform "$OTHER" "${OSHAPE[@]}" --sp --micro-batch 1 \
      --global-batch 128 --recompute full --dist-optimizer --out "$OUT/scale" 2>&1 | tail -60
  else
    echo "no $OTHER GEMM table ($OTHER_TABLE): the $OTHER cluster is projected where one exists"
  fi
fi

PACKED="$WORK/packed"; rm -rf "$PACKED"; mkdir -p "$PACKED"
for b in $INPUTS; do
  case "$b" in
    *.gemm.json) cp "$b" "$PACKED/" ;;
    *) python3 -m kit bundle pack "$b" -o "$PACKED/$(basename "$b").tar.gz" >/dev/null ;;
  esac
done
cp -r "$WORK/pred" "$PACKED/pred"
tar -C "$PACKED" -czf "$OUT/inputs.tar.gz" .
if [ -z "${MEASURED:-}" ] && ls "$WORK"/measured/*/2* >/dev/null 2>&1; then
  (cd "$WORK/measured" && find . \( -name manifest.json -o -name metrics.json \
     -o -name '*.breakdown.json' \) -print0 | tar --null -czf "$OUT/measured.tar.gz" -T -)
fi
ls -la "$OUT"
echo "# done in ${SECONDS}s"
exit $STATUS
