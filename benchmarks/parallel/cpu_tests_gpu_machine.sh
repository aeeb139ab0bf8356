#!/usr/bin/env bash
# The kit's CPU tests on the GPU machine's Python 3.12 / torch / megatron-core, every GPU hidden
# (the kit then detects the cpu platform; ranks run over gloo). One 10-minute device call:
#   source benchmarks/lib.sh; use_carried_wheels; bash benchmarks/parallel/cpu_tests_gpu_machine.sh probe
#   ... cpu_tests_gpu_machine.sh files tests/test_a.py tests/test_b.py ...
# probe: versions; torch's public agent interface the node agents read the ranks' pids through
#        (get_worker_group, a worker's id and global_rank: kit.launch.elastic); one two-node
#        gpt3-tiny torchrun run by hand, every node log and record printed.
# files: each file on its own (pytest -rA, its own time limit), so a cut call still names what
#        failed. Output: $OUT/cpu-tests-gpu-machine-<part>.txt.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/lib.sh
start_budget "${BUDGET_S:-560}"
OUT="${OUT:?}"; PART="${1:?probe|files}"; shift
export CUDA_VISIBLE_DEVICES=
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)," \
       "$(nproc) cores, kit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), every GPU hidden"
  python3 -c "import sys, torch, megatron.core as m; print('# Python', sys.version.split()[0], 'torch', torch.__version__, 'megatron-core', m.__version__)"
  case "$PART" in
    probe)
      python3 - <<'PY'
from torch.distributed.elastic.agent.server.api import Worker
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
print("LocalElasticAgent.get_worker_group:", hasattr(LocalElasticAgent, "get_worker_group"))
w = Worker(local_rank=0)
print("a Worker before it starts: id", w.id, "global_rank", w.global_rank)
PY
      tmp=$(mktemp -d); port=$((20000 + RANDOM % 20000))
      for n in 0 1; do
        timeout "$(left 30)" python3 -m kit run gpt3-tiny --nodes 2 --tp 2 --dp 2 \
          --launcher torchrun --node-rank $n --rdzv-endpoint 127.0.0.1:$port --steps 3 \
          --warmup 1 --out "$tmp" >"$tmp/node$n.out" 2>&1 &
      done
      wait
      for n in 0 1; do echo "## node $n's console"; cat "$tmp/node$n.out"; done
      echo "## every file the run left"; find "$tmp" -type f | sort
      python3 - "$tmp" <<'PY'
import json, sys
from pathlib import Path
for m in Path(sys.argv[1]).glob("*/manifest.json"):
    d = json.loads(m.read_text())
    print("## manifest: status", d.get("status"), "error", d.get("error"))
    print("\n".join(f"note: {n}" for n in d.get("notes") or []))
PY
      find "$tmp" -type f \( -name '*.log' -o -name '*.json' -o -name 'error*' \) ! -name manifest.json \
        -size -64k | sort | while read -r f; do echo "## $f"; tail -40 "$f"; done ;;
    files)
      for f in "$@"; do
        (( $(left) > 20 )) || { echo "# out of time before $f"; break; }
        echo "\$ CUDA_VISIBLE_DEVICES= python3 -m pytest -q -p no:cacheprovider -n ${WORKERS:-6} -rA --tb=short ${PYTEST_K:+-k \"$PYTEST_K\"} $f"
        timeout "$(left 10)" python3 -m pytest -q -p no:cacheprovider -n "${WORKERS:-6}" -rA --tb=short \
          ${PYTEST_K:+-k "$PYTEST_K"} "$f" 2>&1 | grep -vE 'PytestBenchmarkWarning|warner\(' \
          | grep -E '^(PASSED|FAILED|ERROR|SKIPPED|E  |[0-9]+ (passed|failed)|=+ .*(passed|failed|error))|Error|error:' | tail -80
        echo "# exit ${PIPESTATUS[0]}"
      done ;;
    *) echo "usage: $0 probe|files FILE..." >&2; exit 2 ;;
  esac
} 2>&1 | tee "$OUT/cpu-tests-gpu-machine-$PART.txt"
