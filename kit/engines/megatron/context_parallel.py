"""Context parallelism (``--cp``) without Transformer Engine: all-gather key/value attention.

megatron-core's own CP lives in Transformer Engine's ring attention. The kit instead splits
the sequence the way megatron-core does (:func:`megatron.core.utils.get_batch_on_this_cp_rank`:
``2 x cp`` chunks, rank ``r`` holding chunks ``r`` and ``2cp-1-r`` so causal work is balanced,
and megatron's rotary embedding slices itself the same way), and in each attention layer
all-gathers keys and values over the context-parallel group, puts them in sequence order and
runs SDPA of each local query chunk against the keys up to its end, causally aligned to the
lower right (flash attention on GPUs). The backward of the gather is a reduce-scatter (an
all-reduce and a slice on gloo, which has no reduce-scatter), so each rank gets the key/value
gradients of the queries of every peer.

This is Llama 3's all-gather CP rather than a ring: one collective per layer instead of
``cp`` overlapped steps, and key/value activations of the whole sequence per rank.
"""

import functools
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx

from kit.engines.megatron import adapter


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 in the forward; reduce-scatter of the gradient in the backward."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(group.size())]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        group = ctx.group
        size = group.size()
        if dist.get_backend(group) == dist.Backend.NCCL:
            out = grad.new_empty(grad.shape[0] // size, *grad.shape[1:])
            dist.reduce_scatter_tensor(out, grad.contiguous(), group=group)
            return out, None
        total = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(total, group=group)
        return total.chunk(size, dim=0)[group.rank()].contiguous(), None


def gather_sequence(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """``x`` ``[s_local, ...]`` of every rank of ``group``, concatenated in rank order."""
    return _GatherSequence.apply(x, group)


def positions(cp_rank: int, cp_size: int, chunk: int) -> torch.Tensor:
    """Global token positions held by ``cp_rank``: chunks ``r`` and ``2cp-1-r``."""
    return torch.cat([torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk),
                      torch.arange((2 * cp_size - 1 - cp_rank) * chunk,
                                   (2 * cp_size - cp_rank) * chunk)])


@functools.lru_cache(maxsize=8)
def _global_order(chunk: int, cp_size: int, device: torch.device) -> torch.Tensor:
    """Indices that put :func:`gather_sequence`'s rank-by-rank rows in sequence order."""
    held = torch.cat([positions(r, cp_size, chunk) for r in range(cp_size)])
    return torch.argsort(held).to(device)


def local_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cp_rank: int, cp_size: int,
    **sdpa: Any,
) -> torch.Tensor:
    """Causal attention of one CP rank's queries against the whole sequence's keys and values.

    ``query`` ``[b, heads, 2c, d]`` holds chunks ``r`` and ``2cp-1-r``; ``key``/``value``
    ``[b, groups, 2 cp c, d]`` are in sequence order. Chunk ``i`` attends to the keys before
    it and causally within itself: SDPA over the key prefix ``[0, (i + 1) c)`` with a
    lower-right causal bias, which SDPA's flash kernel takes (a boolean mask would not).
    """
    # imported here: torch.nn.attention.bias imports torch._dynamo (seconds of every rank's
    # start-up), and only context-parallel runs need it
    from torch.nn.attention.bias import causal_lower_right

    c = query.shape[2] // 2
    out = []
    for half, chunk in enumerate((cp_rank, 2 * cp_size - 1 - cp_rank)):
        end = (chunk + 1) * c
        out.append(F.scaled_dot_product_attention(
            query[:, :, half * c:(half + 1) * c], key[:, :, :end], value[:, :, :end],
            attn_mask=causal_lower_right(c, end), **sdpa))
    return torch.cat(out, dim=2)


def attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, group: dist.ProcessGroup,
    **sdpa: Any,
) -> torch.Tensor:
    """:func:`local_attention` for megatron's ``[s, b, heads, d]`` tensors of this rank.

    Gathers keys and values over ``group``, puts them in sequence order, and returns
    ``[b, heads, s_local, d]``.
    """
    c = query.shape[0] // 2
    order = _global_order(c, group.size(), query.device)
    key, value = (gather_sequence(t, group).index_select(0, order) for t in (key, value))
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
    return local_attention(q, k, v, group.rank(), group.size(), **sdpa)


def batch_on_this_rank(
    batch: dict[str, torch.Tensor], group: dist.ProcessGroup
) -> dict[str, torch.Tensor]:
    """This context-parallel rank's two sequence chunks of every tensor in ``batch``."""
    return adapter.batch_on_this_cp_rank(dict(batch), group)
