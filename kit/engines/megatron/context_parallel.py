"""Context parallelism (``--cp``) without Transformer Engine: all-gather key/value attention.

megatron-core's own CP lives in Transformer Engine's ring attention. The kit instead splits
the sequence the way megatron-core does (:func:`megatron.core.utils.get_batch_on_this_cp_rank`:
``2 x cp`` chunks, rank ``r`` holding chunks ``r`` and ``2cp-1-r`` so causal work is balanced,
and megatron's rotary embedding slices itself the same way), and in each attention layer
all-gathers keys and values over the context-parallel group, then runs SDPA of the local
queries against every key with a causal mask built from global token positions. The backward
of the gather is a reduce-scatter (an all-reduce and a slice on gloo, which has no
reduce-scatter), so each rank gets the key/value gradients of the queries of every peer.

This is Llama 3's all-gather CP rather than a ring: one collective per layer instead of
``cp`` overlapped steps, and key/value activations of the whole sequence per rank. The mask
keeps SDPA off its flash kernel (memory-efficient or math kernels take masks).
"""

import functools

import torch
import torch.distributed as dist
from torch.autograd.function import FunctionCtx


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


def _positions(cp_rank: int, cp_size: int, chunk: int) -> torch.Tensor:
    """Global token positions held by ``cp_rank``: chunks ``r`` and ``2cp-1-r``."""
    return torch.cat([torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk),
                      torch.arange((2 * cp_size - 1 - cp_rank) * chunk,
                                   (2 * cp_size - cp_rank) * chunk)])


@functools.lru_cache(maxsize=8)
def causal_mask(local_len: int, cp_rank: int, cp_size: int, device: torch.device) -> torch.Tensor:
    """Boolean ``[local_len, cp_size * local_len]`` mask: True where a local query may attend.

    Columns follow :func:`gather_sequence`'s order (rank by rank, each rank's two chunks).
    """
    chunk = local_len // 2
    query = _positions(cp_rank, cp_size, chunk)
    key = torch.cat([_positions(r, cp_size, chunk) for r in range(cp_size)])
    return (key.unsqueeze(0) <= query.unsqueeze(1)).to(device)


def batch_on_this_rank(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This context-parallel rank's two sequence chunks of every tensor in ``batch``."""
    from megatron.core.utils import get_batch_on_this_cp_rank

    return get_batch_on_this_cp_rank(dict(batch))
