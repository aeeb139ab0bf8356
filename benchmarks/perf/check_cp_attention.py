"""The kit's context-parallel attention on one GPU: numerics against full causal SDPA, and cost.

CP needs several GPUs to run for real; what one GPU can check is the attention each CP rank
computes. For every rank of a CP group this takes the rank's query chunks (``r`` and
``2cp-1-r``, megatron's split), the keys and values in :func:`gather_sequence`'s order (rank by
rank) and the kit's :func:`causal_mask`, runs ``scaled_dot_product_attention`` as
``SDPAttention`` does, and compares the rows with full-sequence causal SDPA (flash): the
largest absolute difference of the output and of the query, key and value gradients (key and
value gradients summed over the ranks, as the gather's reduce-scatter sums them). It also times the masked
call per rank against the flash call over the whole sequence divided by CP, which is what a
ring-attention CP would cost per rank at best.

    python benchmarks/perf/check_cp_attention.py --cp 2 --seq 4096 --heads 32 --groups 8
"""

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kit.engines.megatron.context_parallel import _positions, causal_mask


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
    print(f"{name}; torch {torch.__version__}; cp {a.cp}, seq {a.seq}, "
          f"batch {a.batch}, heads {a.heads}, kv groups {a.groups}, head dim {a.head_dim}, {a.dtype}")

    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    grad = torch.randn_like(full)
    dq, dk, dv = torch.autograd.grad(full, (q, k, v), grad)

    chunk = a.seq // (2 * a.cp)
    order = torch.cat([_positions(r, a.cp, chunk) for r in range(a.cp)]).to(dev)
    k_cp, v_cp = k.index_select(2, order), v.index_select(2, order)  # gather_sequence's order
    dk_sum = torch.zeros(kv_shape, device=dev)  # fp32 sums of every rank's key/value grads
    dv_sum = torch.zeros(kv_shape, device=dev)
    worst = {"out": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
    local_len = 2 * chunk
    for rank in range(a.cp):
        mine = _positions(rank, a.cp, chunk).to(dev)
        q_r = q.detach().index_select(2, mine).requires_grad_()
        k_r, v_r = k_cp.detach().requires_grad_(), v_cp.detach().requires_grad_()
        mask = causal_mask(local_len, rank, a.cp, dev)
        out = F.scaled_dot_product_attention(q_r, k_r, v_r, attn_mask=mask, enable_gqa=gqa)
        g_q, g_k, g_v = torch.autograd.grad(out, (q_r, k_r, v_r), grad.index_select(2, mine))
        dk_sum.index_add_(2, order, g_k.float())
        dv_sum.index_add_(2, order, g_v.float())
        worst["out"] = max(worst["out"], (out - full.index_select(2, mine)).abs().max().item())
        worst["dq"] = max(worst["dq"], (g_q - dq.index_select(2, mine)).abs().max().item())
    worst["dk"] = (dk_sum - dk.float()).abs().max().item()
    worst["dv"] = (dv_sum - dv.float()).abs().max().item()
    scale = {"out": full.abs().max().item(), "dq": dq.abs().max().item(),
             "dk": dk.abs().max().item(), "dv": dv.abs().max().item()}
    for name in worst:
        print(f"max |cp - full| {name:3s} {worst[name]:.3e}  (max |full| {scale[name]:.3e})")

    q0 = q.detach().index_select(2, _positions(0, a.cp, chunk).to(dev))
    mask0 = causal_mask(local_len, 0, a.cp, dev)
    masked = _time(lambda: F.scaled_dot_product_attention(
        q0, k_cp, v_cp, attn_mask=mask0, enable_gqa=gqa), dev)
    flash = _time(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa), dev)
    print(f"forward per CP rank: masked SDPA {masked * 1e3:.3f} ms; full-sequence flash / cp "
          f"{flash / a.cp * 1e3:.3f} ms (ratio {masked / (flash / a.cp):.2f}x)")


if __name__ == "__main__":
    main()
