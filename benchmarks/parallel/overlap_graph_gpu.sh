#!/usr/bin/env bash
# --overlap inside the CUDA-graph step (issue 35's "every layout keeps its speed"): gpt3-1.3b,
# micro-batch 2, global batch 16, DP over every GPU of the host, the same seed, 12 steps each:
#   1. --dist-optimizer (the graphed reference)
#   2. --dist-optimizer --overlap (now graphed: reduce-scatters overlapped inside the graph)
#   3. --overlap (plain DDP, all-reduces overlapped inside the graph)
#   4. --dist-optimizer --overlap eager (--speed without cuda_graph: the numerics reference)
# and prints each run's step, MFU, engine notes and per-step losses (rank 0), so graph and eager
# losses compare step by step. OUT=DIR bash benchmarks/parallel/overlap_graph_gpu.sh (one call,
# ~4 minutes on 2 GPUs). With this workplace's device tool, carry .whl/ (installed into /tmp/site).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:?set OUT}"; mkdir -p "$OUT"
if ! python3 -c "import megatron.core, pydantic" >/dev/null 2>&1 && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
N=$(nvidia-smi -L | wc -l)
EAGER=$(python3 -c "from kit.engines.megatron.speed import DEFAULT; print(','.join(sorted(DEFAULT - {'cuda_graph'})))")
exec > >(tee -a "$OUT/overlap-graph.txt") 2>&1
echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$N; kit ${KIT_COMMIT:-unknown}"
run() {  # NAME ARGS...
  local name=$1; shift
  echo "## $name: charllm-kit run gpt3-1.3b --dp $N --micro-batch 2 --global-batch 16 --steps 12 --warmup 3 $*"
  python3 -m kit run gpt3-1.3b --dp "$N" --micro-batch 2 --global-batch 16 --steps 12 --warmup 3 \
    --min-measured-s 0 --out "/tmp/ovg/$name" "$@" 2>&1 | grep -E "^status|step time|MFU|mean power|error" 
  python3 - "$(ls -dt /tmp/ovg/"$name"/2* | head -1)" <<'PY'
import json, sys
from pathlib import Path
import pyarrow.parquet as pq
b = Path(sys.argv[1])
m = json.loads((b / "metrics.json").read_text())
print("notes:", "; ".join(n for n in m.get("notes", []) if "overlap" in n or "graph" in n))
t = pq.read_table(b / "steps.parquet").to_pylist()
print("losses:", " ".join(f"{r['loss']:.4f}" for r in sorted(t, key=lambda r: r["step"]) if r["rank"] == 0))
PY
}
run distopt --dist-optimizer
run distopt-overlap --dist-optimizer --overlap
run overlap --overlap
run distopt-overlap-eager --dist-optimizer --overlap --speed "$EAGER"
echo "# done in ${SECONDS}s"
