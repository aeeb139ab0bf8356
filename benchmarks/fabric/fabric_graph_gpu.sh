#!/usr/bin/env bash
# Small-message latency on one GPU node: the host loop against the same operations replayed from
# a CUDA graph (nccl-tests' -G), and large-message busbw, for all_reduce, all_gather and
# reduce_scatter from 8 B to 1 GiB by 2x (issue 26). About 2 minutes on 4 H100/H200.
#   OUT=/some/dir bash benchmarks/fabric/fabric_graph_gpu.sh          # every GPU of this node
#   OUT=/some/dir bash benchmarks/fabric/fabric_graph_gpu.sh 4        # NPROC GPUs
#   OUT=/tmp/x bash benchmarks/fabric/fabric_graph_gpu.sh --cpu       # the same on gloo, 8 B..1 MiB
# Files in $OUT: fabric-graph-<tag>.txt (everything printed), fabric-graph-<tag>.json (fabric.json:
# every point's host-loop and graph times, algbw and busbw). Exit 1 when the fabric run failed or,
# on GPUs, measured no graph times.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-results/evidence}"; RUNS="$(mktemp -d)"; mkdir -p "$OUT"

if [[ "${1:-}" == "--cpu" ]]; then
  PLATFORM=cpu; NPROC=2; TOP=20; ITERS=2
else
  PLATFORM="$(python3 -m kit platforms detect 2>/dev/null | cut -f1)"
  NPROC="${1:-$(nvidia-smi -L | wc -l)}"; TOP=30; ITERS=20
fi
SIZES="$(python3 -c "print(','.join(str(1 << k) for k in range(3, $TOP + 1)))")"
TAG="${PLATFORM}x$NPROC"

{
  echo "# $(date -u +%FT%TZ) fabric: host loop vs CUDA graph, $TAG"
  if [[ "$PLATFORM" != cpu ]]; then
    echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l)"
  fi
  python3 -c "import torch; print('# torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)" 2>&1 | tail -1
  echo "# kit commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo -dirty)"
  echo "\$ charllm-kit fabric --platform $PLATFORM --nproc $NPROC --ops all_reduce,all_gather,reduce_scatter --sizes 8..$((1 << TOP)) (x2) --iters $ITERS --warmup 5"
  timeout 420 python3 -m kit fabric --platform "$PLATFORM" --nproc "$NPROC" \
    --ops all_reduce,all_gather,reduce_scatter --sizes "$SIZES" --iters "$ITERS" --warmup 5 \
    --out "$RUNS" 2>&1 | grep -v -i warn
  BUNDLE="$(ls -d "$RUNS"/2* 2>/dev/null | tail -1)"
  if [[ -z "$BUNDLE" || ! -f "$BUNDLE/fabric.json" ]]; then
    echo "FAILED: no fabric results (see above)"; exit 1
  fi
  cp "$BUNDLE/fabric.json" "$OUT/fabric-graph-$TAG.json"
  # Small messages: where the host's launch cost shows; large: busbw, unchanged by the graph.
  python3 - "$BUNDLE/fabric.json" "$PLATFORM" <<'EOF'
import json, statistics, sys
r = json.load(open(sys.argv[1]))
print(f"# summary: {r['ranks']} ranks over {r['backend']}, graph times: {r['graph']}")
for op in ("all_reduce", "all_gather", "reduce_scatter"):
    pts = [p for p in r["points"] if p["op"] == op]
    small = [p for p in pts if 1024 <= p["size_bytes"] <= 1 << 20]
    loop = statistics.median(p["time_s"] * 1e6 for p in small) if small else None
    graph = [p["graph_time_s"] * 1e6 for p in small if p["graph_time_s"]]
    top = max(pts, key=lambda p: p["size_bytes"])
    g = f"{statistics.median(graph):.1f} us" if graph else "n/a"
    gb = f"{top['graph_busbw_gbps']:.1f}" if top["graph_busbw_gbps"] else "n/a"
    print(f"{op}: 1 KiB..1 MiB median host loop {loop:.1f} us, graph {g}; "
          f"at {top['size_bytes']} B busbw {top['busbw_gbps']:.1f} GB/s (graph {gb})")
if sys.argv[2] != "cpu" and not r["graph"]:
    sys.exit("FAILED: no CUDA-graph times on GPUs")
EOF
} 2>&1 | tee "$OUT/fabric-graph-$TAG.txt"
exit "${PIPESTATUS[0]}"
