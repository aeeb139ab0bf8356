#!/usr/bin/env bash
# Runs through torch's elastic agent (`--launcher torchrun`) on this machine's GPUs, beside the
# same run under the local launcher: the agent path (spawned ranks, torch's start_processes, the
# node record and merge) on a GPU platform and this machine's torch. One GPU: one node agent
# (--nodes 1); two or more: two node agents on this host, each given half the GPUs.
#   source benchmarks/lib.sh; use_carried_wheels; bash benchmarks/parallel/elastic_gpu.sh
# Writes $OUT/elastic-gpu-<gpus>.txt; bundles under /tmp/elastic-gpu.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/lib.sh
start_budget "${BUDGET_S:-540}"
OUT="${OUT:?}"; RUNS=/tmp/elastic-gpu; rm -rf "$RUNS"; mkdir -p "$RUNS"
TAG=$(gpu_tag); GPUS=$(nvidia-smi -L | wc -l)
ARGS=(gpt3-small --dp "$GPUS" --steps 8 --warmup 2 --telemetry-interval-ms 50)
quiet() { grep -v -iE 'warn|^\s*"""|^gpt3-small on'; }
{
  echo "# $(date -u +%FT%TZ) $TAG, $(nproc) cores, kit $(git rev-parse --short HEAD 2>/dev/null)"
  python3 -c "import sys, torch, megatron.core as m; print('# Python', sys.version.split()[0], 'torch', torch.__version__, 'megatron-core', m.__version__)" 2>&1 | tail -1
  port=$((20000 + RANDOM % 20000))
  if (( GPUS >= 2 )); then
    half=$((GPUS / 2)); first=$(seq -s, 0 $((half - 1))); second=$(seq -s, "$half" $((GPUS - 1)))
    echo "\$ CUDA_VISIBLE_DEVICES=$first|$second charllm-kit run ${ARGS[*]} --nodes 2 --launcher torchrun --node-rank 0|1 --rdzv-endpoint 127.0.0.1:$port"
    for n in 0 1; do
      devs=$([[ $n == 0 ]] && echo "$first" || echo "$second")
      CUDA_VISIBLE_DEVICES=$devs timeout "$(left 60)" python3 -m kit run "${ARGS[@]}" --nodes 2 \
        --launcher torchrun --node-rank $n --rdzv-endpoint 127.0.0.1:$port --out "$RUNS" \
        >"$RUNS/node$n.out" 2>&1 &
    done
    wait; echo "node 1's last line: $(tail -1 "$RUNS/node1.out")"; quiet <"$RUNS/node0.out" | tail -14
  else
    echo "\$ charllm-kit run ${ARGS[*]} --nodes 1 --launcher torchrun --node-rank 0 --rdzv-endpoint 127.0.0.1:$port"
    timeout "$(left 60)" python3 -m kit run "${ARGS[@]}" --nodes 1 --launcher torchrun \
      --node-rank 0 --rdzv-endpoint 127.0.0.1:$port --out "$RUNS" 2>&1 | quiet | tail -14
  fi
  echo "\$ charllm-kit run ${ARGS[*]}   # the local launcher, the same work"
  timeout "$(left 10)" python3 -m kit run "${ARGS[@]}" --out "$RUNS" 2>&1 | quiet | tail -14
  mapfile -t BUNDLES < <(ls -d "$RUNS"/2*)
  for b in "${BUNDLES[@]}"; do
    python3 - "$b" <<'PY'
import json, sys
from pathlib import Path
b = Path(sys.argv[1])
m = json.loads((b / "manifest.json").read_text())
print(b.name, "launcher", m["config"]["launcher"], "nodes", m["config"]["nodes"], "status",
      m["status"], "error", m["error"], "ranks",
      [(r["rank"], r["node"], r["local_rank"]) for r in m["ranks"]])
PY
    python3 -m kit bundle verify "$b" 2>&1 | tail -1
  done
  echo "\$ charllm-kit compare <both> --baseline <the torchrun run>"
  python3 -m kit compare "${BUNDLES[@]}" --baseline "${BUNDLES[0]}" 2>&1 | grep -v -i warn
} 2>&1 | tee "$OUT/elastic-gpu-$TAG.txt"
