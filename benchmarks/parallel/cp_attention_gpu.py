"""Which kernels the kit's context-parallel attention runs, and what they cost, on one GPU.

Issue 35's CP row (gpt3-1.3b, sequence 8192, CP2 x TP2 + SP) asks whether the per-rank
attention math is at flash speed. For every rank of a CP group this runs
:func:`~kit.engines.megatron.context_parallel.local_attention` (the rank's query chunks ``r``
and ``2cp-1-r`` against the whole sequence's keys and values, what ``SDPAttention`` does after
its all-gather) forward and backward, and prints:

* the GPU kernels one call launches (from ``torch.profiler``), so a fall-back from flash to the
  memory-efficient or math kernel shows at once;
* host time per call (launches only, no synchronization): what an eager step pays;
* GPU time per call replayed from a CUDA graph (what a captured step pays), against plain
  full-sequence causal flash SDPA forward and backward divided by ``cp`` (a perfectly balanced
  CP rank), the ratio the goal is about.

    python benchmarks/parallel/cp_attention_gpu.py            # gpt3-1.3b under TP2: 8 heads
    python benchmarks/parallel/cp_attention_gpu.py --device cpu --seq 256 --repeat 2  # a check
"""

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kit.engines.megatron.context_parallel import local_attention, positions


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _gpu_ms(fn: Callable[[], object], dev: torch.device, repeat: int) -> tuple[float, str]:
    """Milliseconds per call and how they were timed: replayed from a CUDA graph on GPUs (so
    no host time is in them), plain calls on CPU or where the capture fails."""
    for _ in range(2):
        fn()
    _sync(dev)
    run: Callable[[], object] = fn
    mode = "eager"
    if dev.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
            graph.replay()
            _sync(dev)
            run, mode = graph.replay, "graph-replayed"
        except RuntimeError as e:
            mode = f"eager, capture failed: {str(e).splitlines()[0][:120]}"
    start = time.perf_counter()
    for _ in range(repeat):
        run()
    _sync(dev)
    return (time.perf_counter() - start) / repeat * 1e3, mode


def _host_ms(fn: Callable[[], object], dev: torch.device, repeat: int) -> float:
    """Milliseconds of host time per call (launch cost only; the GPU may still be busy)."""
    _sync(dev)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    spent = time.perf_counter() - start
    _sync(dev)
    return spent / repeat * 1e3


def _kernels(fn: Callable[[], object], dev: torch.device) -> list[str]:
    """Names of the device kernels (CPU ops on CPU) of one call, attention ones first."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CUDA] if dev.type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        fn()
        _sync(dev)
    names = {e.key for e in prof.key_averages()
             if dev.type == "cpu" or e.device_type.name == "CUDA"}
    attn = sorted(n for n in names if any(w in n.lower() for w in ("flash", "fmha", "attention",
                                                                    "efficient", "softmax")))
    return attn or sorted(names)[:12]


def _fwd_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor,
             attend: Callable[..., torch.Tensor]) -> Callable[[], object]:
    def step() -> object:
        out = attend(q, k, v)
        return torch.autograd.grad(out, (q, k, v), grad)
    return step


def main() -> None:
    """Print kernel names and timings of every CP rank's attention against full flash."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8, help="per TP rank (gpt3-1.3b: 16 / tp)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to check this script")
    a = ap.parse_args()
    dev = torch.device(a.device)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gen = torch.Generator(device=dev).manual_seed(0)
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    q, k, v = (torch.randn(shape, device=dev, dtype=dt, generator=gen).requires_grad_()
               for _ in range(3))
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"# {name}; torch {torch.__version__}; cp {a.cp}, seq {a.seq}, batch {a.batch}, "
          f"heads {a.heads}, head dim {a.head_dim}, {dt}")

    full = _fwd_bwd(q, k, v, torch.randn_like(q),
                    lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_, is_causal=True))
    print(f"full-sequence causal SDPA kernels: {', '.join(_kernels(full, dev))}")
    full_ms, full_mode = _gpu_ms(full, dev, a.repeat)
    ideal = full_ms / a.cp
    chunk = a.seq // (2 * a.cp)
    for rank in range(a.cp):
        mine = positions(rank, a.cp, chunk).to(dev)
        q_r = q.detach().index_select(2, mine).requires_grad_()
        cp = _fwd_bwd(q_r, k, v, torch.randn_like(q_r),
                      lambda q_, k_, v_, r=rank: local_attention(q_, k_, v_, r, a.cp))
        print(f"rank {rank} kit CP attention kernels: {', '.join(_kernels(cp, dev))}")
        spent, mode = _gpu_ms(cp, dev, a.repeat)
        print(f"rank {rank} forward+backward: kit CP {spent:.3f} ms ({mode}), "
              f"host {_host_ms(cp, dev, a.repeat):.3f} ms/call eager; full flash / cp "
              f"{ideal:.3f} ms ({full_mode}); ratio {spent / ideal:.2f}x")


if __name__ == "__main__":
    main()
