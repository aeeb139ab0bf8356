"""Where one kit training step loses time: GPU idle gaps and the ops behind each kernel.

Profiles one step of the kit's megatron engine (after warmup) with CPU, CUDA and Python-stack
events, writes the Chrome trace (gzip) and prints, from that trace:

* the step's wall time, the time some kernel was running, and the idle rest;
* the idle gaps grouped by the innermost megatron-core / kit / torch.optim Python frame the
  CPU was in while the GPU waited (that is the code to make asynchronous or cheaper);
* GPU time per kernel, and grouped by the aten op (and input shapes) that launched it.

    python benchmarks/perf/trace_step.py --out trace.json.gz   # on a GPU
    python benchmarks/perf/trace_step.py --analyze trace.json.gz  # anywhere, from a saved trace
"""

import argparse
import gzip
import json
import os
import socket
from bisect import bisect_right
from collections import defaultdict
from pathlib import Path
from typing import Any

OWN_FRAMES = ("megatron/core", "kit/engines", "torch/optim")
"""Python frames worth naming when the GPU waits: the engine's code, not the profiler's."""


def record(out: Path, workload: str, stack: bool) -> None:
    """Profile one warmed-up step of the kit engine and write its Chrome trace to ``out``.

    ``stack`` adds Python frames (to name the code behind gaps) but slows the CPU side about
    1.5x, which opens gaps of its own; gap sizes are real only without it.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kit.engines.megatron.engine import MegatronEngine
    from kit.plan.detect import detect_platform
    from kit.plan.resolve import RunRequest, resolve

    req = RunRequest(workload=workload, platform=detect_platform().name,
                     micro_batch_size=4, global_batch_size=16, telemetry_interval_ms=0)
    cfg = resolve(req, require_present=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    engine = MegatronEngine()
    engine.setup(cfg, 0, 0, 1)
    for step in range(3):
        engine.train_step(step)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 record_shapes=True, with_stack=stack) as prof:
        engine.train_step(3)
        torch.cuda.synchronize()
    engine.teardown()
    raw = out.with_suffix("")
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(out, "wb") as dst:
        dst.write(src.read())
    raw.unlink()


def _load(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def _own_frame(stack: list[dict[str, Any]]) -> str:
    """The innermost engine frame of a Python stack (outermost first)."""
    for ev in reversed(stack):
        name = ev["name"]
        if any(k in name for k in OWN_FRAMES):
            return name.split("site-packages/")[-1][:100]
    return stack[-1]["name"][:100] if stack else "?"


def analyze(path: Path, top: int = 25) -> None:
    """Print idle gaps by Python frame and GPU time by launching aten op."""
    events = [e for e in _load(path) if e.get("ph") == "X"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    cpu_ops = {e["args"]["External id"]: e for e in events
               if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    py = sorted((e for e in events if e.get("cat") == "python_function"), key=lambda e: e["ts"])
    py_starts = [e["ts"] for e in py]

    start, end = kernels[0]["ts"], max(k["ts"] + k["dur"] for k in kernels)
    busy, gaps, horizon = 0.0, [], start
    for k in kernels:
        if k["ts"] > horizon:
            gaps.append((horizon, k["ts"]))
        busy += max(0.0, k["ts"] + k["dur"] - max(horizon, k["ts"]))
        horizon = max(horizon, k["ts"] + k["dur"])
    wall = end - start
    print(f"step span {wall / 1e3:.1f} ms: kernels busy {busy / 1e3:.1f} ms, "
          f"idle {(wall - busy) / 1e3:.1f} ms in {len(gaps)} gaps")
    bounds = (5, 20, 100, 1000, 10**12)
    sizes = dict.fromkeys(bounds, 0.0)
    for g0, g1 in gaps:
        sizes[next(b for b in bounds if g1 - g0 < b)] += g1 - g0
    print("idle time by gap length: " + ", ".join(
        f"{'<' + str(b) + ' us' if b < bounds[-1] else 'longer'} {v / 1e3:.1f} ms"
        for b, v in sizes.items()))

    by_frame: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for g0, g1 in gaps:
        mid = (g0 + g1) / 2
        stack = [e for e in py[:bisect_right(py_starts, mid)]
                 if e["ts"] <= mid <= e["ts"] + e["dur"]]
        cell = by_frame[_own_frame(stack)]
        cell[0] += g1 - g0
        cell[1] += 1
    if not py:
        by_frame.clear()
    else:
        print("idle GPU time by the engine frame the CPU was in:")
    for frame, (us, n) in sorted(by_frame.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {us / 1e3:8.2f} ms  x{n:<5d} {frame}")

    by_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for k in kernels:
        by_kernel[k["name"][:110]][0] += k["dur"]
        by_kernel[k["name"][:110]][1] += 1
    print("GPU time by kernel:")
    for name, (us, n) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {us / 1e3:8.2f} ms  x{n:<5d} {name}")

    # kernels replayed from a CUDA graph have no launching op: they show as "?"
    by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for k in kernels:
        op = cpu_ops.get(k.get("args", {}).get("External id"))
        key = "?" if op is None else f"{op['name']} {op['args'].get('Input Dims', '')}"
        by_op[key[:150]][0] += k["dur"]
        by_op[key[:150]][1] += 1
    print("GPU time by launching op (input shapes):")
    for key, (us, n) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top * 2]:
        print(f"  {us / 1e3:8.2f} ms  x{n:<5d} {key}")


def main() -> None:
    """Record (on a GPU) and/or analyze a step trace."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, help="record a trace here (.json.gz)")
    parser.add_argument("--analyze", type=Path, help="analyze a saved trace")
    parser.add_argument("--workload", default="gpt3-1.3b")
    parser.add_argument("--stack", action="store_true", help="record Python frames too")
    args = parser.parse_args()
    if args.out:
        record(args.out, args.workload, args.stack)
    path = args.analyze or args.out
    if path:
        analyze(path)


if __name__ == "__main__":
    main()
