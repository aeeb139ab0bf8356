"""The kit's context-parallel attention on one GPU: numerics against full causal SDPA, and cost.

CP needs several GPUs to run for real; what one GPU can check is the attention each CP rank
computes. For every rank of a CP group this takes the rank's query chunks (``r`` and
``2cp-1-r``, megatron's split) and runs the kit's
:func:`~kit.engines.megatron.context_parallel.local_attention` against the whole sequence's
keys and values, as ``SDPAttention`` does after its all-gather, and compares with
full-sequence causal SDPA: the largest absolute difference of the output and of the query,
key and value gradients (key and value gradients summed over the ranks, as the gather's
reduce-scatter sums them). It also times one rank's forward against the full-sequence flash
call divided by CP, what a perfectly balanced CP would cost per rank.

    python benchmarks/perf/check_cp_attention.py --cp 2 --seq 4096 --heads 32 --groups 8
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


def _time(fn: Callable[[], object], dev: torch.device, repeat: int = 20) -> float:
    for _ in range(3):
        fn()
    _sync(dev)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    _sync(dev)
    return (time.perf_counter() - start) / repeat


def main() -> None:
    """Compare every CP rank's masked attention with full causal attention, then time both."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu to check this script")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    a = ap.parse_args()
    dev = torch.device(a.device)
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    gen = torch.Generator(device=dev).manual_seed(0)
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    kv_shape = (a.batch, a.groups, a.seq, a.head_dim)
    q = torch.randn(shape, device=dev, dtype=dt, generator=gen, requires_grad=True)
    k = torch.randn(kv_shape, device=dev, dtype=dt, generator=gen, requires_grad=True)
    v = torch.randn(kv_shape, device=dev, dtype=dt, generator=gen, requires_grad=True)
    gqa = a.heads != a.groups
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"{name}; torch {torch.__version__}; cp {a.cp}, seq {a.seq}, batch {a.batch}, "
          f"heads {a.heads}, kv groups {a.groups}, head dim {a.head_dim}, {a.dtype}")

    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    grad = torch.randn_like(full)
    dq, dk, dv = torch.autograd.grad(full, (q, k, v), grad)

    chunk = a.seq // (2 * a.cp)
    dk_sum = torch.zeros(kv_shape, device=dev)  # fp32 sums of every rank's key/value grads
    dv_sum = torch.zeros(kv_shape, device=dev)
    worst = {"out": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
    for rank in range(a.cp):
        mine = positions(rank, a.cp, chunk).to(dev)
        q_r = q.detach().index_select(2, mine).requires_grad_()
        k_r, v_r = k.detach().requires_grad_(), v.detach().requires_grad_()
        out = local_attention(q_r, k_r, v_r, rank, a.cp, enable_gqa=gqa)
        g_q, g_k, g_v = torch.autograd.grad(out, (q_r, k_r, v_r), grad.index_select(2, mine))
        dk_sum += g_k.float()
        dv_sum += g_v.float()
        worst["out"] = max(worst["out"], (out - full.index_select(2, mine)).abs().max().item())
        worst["dq"] = max(worst["dq"], (g_q - dq.index_select(2, mine)).abs().max().item())
    worst["dk"] = (dk_sum - dk.float()).abs().max().item()
    worst["dv"] = (dv_sum - dv.float()).abs().max().item()
    scale = {"out": full.abs().max().item(), "dq": dq.abs().max().item(),
             "dk": dk.abs().max().item(), "dv": dv.abs().max().item()}
    for name in worst:
        print(f"max |cp - full| {name:3s} {worst[name]:.3e}  (max |full| {scale[name]:.3e})")

    q0 = q.detach().index_select(2, positions(0, a.cp, chunk).to(dev))
    kd, vd = k.detach(), v.detach()
    local = _time(lambda: local_attention(q0, kd, vd, 0, a.cp, enable_gqa=gqa), dev)
    flash = _time(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa), dev)
    print(f"forward per CP rank: kit CP attention {local * 1e3:.3f} ms; full-sequence flash / cp "
          f"{flash / a.cp * 1e3:.3f} ms (ratio {local / (flash / a.cp):.2f}x)")


if __name__ == "__main__":
    main()
