#!/usr/bin/env bash
# Issue 24's evidence on one machine of four GPUs, in parts that each fit one 10-minute device
# call and resume where they stopped (the sweep folders live in results/node-evidence/, which
# persists while the machine stays warm; a part that ran out of time is called again).
#   benchmarks/parallel/node_evidence.sh layouts   sweeps/node4-study-layouts.yaml (full width)
#   benchmarks/parallel/node_evidence.sh small     sweeps/node4-small-shapes.yaml (gpt3-1.3b)
#   benchmarks/parallel/node_evidence.sh refs      plain PyTorch DDP and tensor-parallel references
#   benchmarks/parallel/node_evidence.sh cpu019    the parallel-layout CPU tests (in background)
# Each part writes into $OUT: <gpu>x<N>-<part>.txt (what it printed), <gpu>x<N>-<part>.json
# (benchmarks/parallel/summarize.py) and bundles-<gpu>x<N>-<part>.tar.gz (each bundle's
# manifest.json, metrics.json and profile breakdowns). PART_BUDGET_S (default 480) bounds a part.
set -uo pipefail
PART="$1"
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/node-evidence/out}"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
source benchmarks/lib.sh
TAG=$(gpu_tag); NGPUS=${TAG##*x}
RESULTS=results/node-evidence
start_budget "${PART_BUDGET_S:-480}"
header() {
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$NGPUS, driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  python3 -c "import torch, megatron.core as m, deepspeed; print('# torch', torch.__version__, 'megatron-core', m.__version__, 'deepspeed', deepspeed.__version__)" 2>&1 | tail -1
  # KIT_COMMIT: the commit the tree was copied from, where the copy's own git history is not it
  echo "# kit commit: ${KIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
}
sweep_part() {  # SWEEP_FILE NAME
  local file="$1" name="$2" folder="$RESULTS/$2"
  local resume=(); [[ -f "$folder/sweep.json" ]] && resume=(--resume)
  echo "\$ charllm-kit sweep $file --out $RESULTS ${resume[*]}"
  timeout --signal=TERM "$(left 10)" python3 -m kit sweep "$file" --out "$RESULTS" "${resume[@]}" 2>&1 \
    | grep -v -iE 'warn|^\s*$'
  echo "\$ python3 benchmarks/parallel/summarize.py $folder --json $TAG-$PART.json"
  python3 benchmarks/parallel/summarize.py "$folder" --json "$OUT/$TAG-$PART.json" \
    ${REFS:+--refs "$REFS"}
}
pack() {  # FOLDER: manifests, metrics and breakdowns of its bundles
  local folder="$1"
  (cd "$folder" && find . \( -name manifest.json -o -name metrics.json -o -name 'rank*.breakdown.json' -o -name sweep.json \) \
     -not -path '*.partial*' -print0 | tar --null -czf "$OUT/bundles-$TAG-$PART.tar.gz" -T -)
}
{
  header
  case "$PART" in
    layouts) sweep_part sweeps/node4-study-layouts.yaml node4-study-layouts
             pack "$RESULTS/node4-study-layouts" ;;
    small)   REFS="$RESULTS/refs.json"
             sweep_part sweeps/node4-small-shapes.yaml node4-small-shapes
             pack "$RESULTS/node4-small-shapes" ;;
    refs)
      echo "\$ python3 benchmarks/parallel/dp_scaling.py --gpus $NGPUS --micro-batch 2 --accum 2 --kit-args=--dist-optimizer"
      python3 benchmarks/parallel/dp_scaling.py --gpus "$NGPUS" --micro-batch 2 --accum 2 \
        --kit-args=--dist-optimizer --json "$OUT/$TAG-dp_scaling.json" 2>&1 | grep -v -i warn
      echo "\$ python3 benchmarks/parallel/tp_reference.py --gpus $NGPUS --tp 2 --micro-batch 2 --global-batch 16 --kit"
      python3 benchmarks/parallel/tp_reference.py --gpus "$NGPUS" --tp 2 --micro-batch 2 \
        --global-batch 16 --kit --json "$OUT/$TAG-tp_reference.json" 2>&1 | grep -v -i warn
      python3 - "$OUT/$TAG-dp_scaling.json" "$OUT/$TAG-tp_reference.json" "$RESULTS/refs.json" <<'EOF'
import json, sys
from pathlib import Path
dp, tp, out = (Path(p) for p in sys.argv[1:4])
refs = {}
if dp.is_file():
    d = json.loads(dp.read_text())
    n = d["gpus"]
    refs[f"gpt3-1.3b tp1 pp1 dp{n} cp1 ep1 distopt"] = {
        "ref_name": f"plain PyTorch DDP, {n} GPUs", "ref_step_s": d[f"torch_ddp_{n}_step_s"],
        "dp_scaling_kit": d["kit_scaling"], "dp_scaling_torch": d["torch_ddp_scaling"]}
if tp.is_file():
    t = json.loads(tp.read_text())
    refs[f"gpt3-1.3b tp{t['tp']} pp1 dp{t['dp']} cp1 ep1 sp"] = {
        "ref_name": t["name"], "ref_step_s": t["step_s"]}
out.write_text(json.dumps(refs, indent=1))
print("references:", json.dumps(refs, indent=1))
EOF
      cp "$RESULTS/refs.json" "$OUT/$TAG-refs.json" ;;
    cpu019)
      # The parallel-layout CPU tests under this machine's Python and megatron-core, every GPU
      # hidden (the kit then detects the cpu platform; ranks run over gloo).
      echo "\$ CUDA_VISIBLE_DEVICES= python3 -m pytest -q -p no:cacheprovider tests/test_megatron_parallel_cpu.py tests/test_visible_devices.py tests/test_engine_numerics.py"
      CUDA_VISIBLE_DEVICES= timeout "$(left 10)" python3 -m pytest -q -p no:cacheprovider \
        --durations=15 tests/test_megatron_parallel_cpu.py tests/test_visible_devices.py \
        tests/test_engine_numerics.py 2>&1 | tail -60 ;;
    *) echo "usage: $0 layouts|small|refs|cpu019" >&2; exit 2 ;;
  esac
} 2>&1 | tee "$OUT/$TAG-$PART.txt"
