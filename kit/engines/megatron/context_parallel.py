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

Everything a step needs besides its collectives and kernels is built once and cached on the
device (the chunk indices of the batch split and of the key/value reorder), and the step holds
no host-to-device copy and no host read of a device value, so CUDA-graph capture of the whole
step (:mod:`kit.engines.megatron.step_graph`) replays it (megatron-core's rotary embedding
takes its CP slice inside an ``lru_cache``-d forward, so it too is built in the eager warm-up
step, not in the captured one): the gathers are single NCCL
``all_gather_into_tensor`` calls, and torch's lower-right ``CausalBias`` dispatches to the flash
kernel itself (``torch.ops.aten._scaled_dot_product_flash_attention``, whose causal flag is
lower-right aligned) whenever ``can_use_flash_attention`` holds, so no mask is built.
"""

import functools
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 in the forward; reduce-scatter of the gradient in the backward."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        if dist.get_backend(group) == dist.Backend.NCCL:
            out = x.new_empty(x.shape[0] * group.size(), *x.shape[1:])
            dist.all_gather_into_tensor(out, x, group=group)
            return out
        parts = [torch.empty_like(x) for _ in range(group.size())]
        dist.all_gather(parts, x, group=group)
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


@functools.lru_cache(maxsize=8)
def _local_positions(cp_rank: int, cp_size: int, chunk: int, device: torch.device) -> torch.Tensor:
    """:func:`positions` on ``device``, built once (no host-to-device copy in a captured step)."""
    return positions(cp_rank, cp_size, chunk).to(device)


def batch_on_this_rank(
    batch: dict[str, torch.Tensor], group: dist.ProcessGroup
) -> dict[str, torch.Tensor]:
    """This context-parallel rank's two sequence chunks of every ``[b, s]`` tensor in ``batch``.

    The split of megatron-core's ``get_batch_on_this_cp_rank`` (chunks ``r`` and ``2cp-1-r``
    of ``2cp``, which its rotary embedding assumes), with one cached device index per shape
    instead of an index built on every call, and the same code under every megatron-core
    release (0.19 changed that function's signature).
    """
    out = {}
    for key, value in batch.items():
        index = _local_positions(group.rank(), group.size(),
                                 value.shape[1] // (2 * group.size()), value.device)
        out[key] = value.index_select(1, index)
    return out
