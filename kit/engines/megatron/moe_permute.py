"""Token permutation for dropless MoE dispatch without a device-to-host synchronization.

megatron-core's unfused ``permute`` (the one it runs without Transformer Engine) gathers each
expert's tokens with ``masked_select`` on the routing map, twice per MoE layer and micro-batch
(token indices, then probabilities). ``masked_select`` must learn its output size on the host,
so each call waits for the GPU to drain, and the GPU then idles while the host queues the next
kernels. In dropless routing the size is known already (every token picks exactly top-k
experts: ``num_out_tokens = tokens * k``), so :func:`sync_free_permute` finds the same indices
with a stable sort of the expert-major routing map instead: same order (expert by expert,
tokens ascending within each), same outputs and gradients, no synchronization. megatron-core
0.19's own unfused ``permute`` sorts the same way (and returns five values, padding offsets and
tokens per expert added), so there the feature changes nothing but keeps that return shape.
"""

import inspect
from typing import Any

import torch


def sync_free_permute(original: Any) -> Any:
    """megatron-core's ``permute`` with its dropless, unfused path made synchronization-free.

    Args:
        original: megatron-core's ``moe_utils.permute``, called for every other case (fused
            kernels, drop-and-pad, an output size known only on the device, or arguments a
            later release added).
    """
    five = "tokens_per_expert" in inspect.signature(original).parameters

    def permute(tokens: torch.Tensor, routing_map: torch.Tensor,
                probs: torch.Tensor | None = None, num_out_tokens: int | None = None,
                fused: bool = False, drop_and_pad: bool = False, **more: Any,
                ) -> tuple[torch.Tensor | None, ...]:
        if fused or drop_and_pad or more or not isinstance(num_out_tokens, int):
            return original(tokens, routing_map, probs=probs, num_out_tokens=num_out_tokens,
                            fused=fused, drop_and_pad=drop_and_pad, **more)
        num_tokens = tokens.shape[0]
        # [tokens, experts] -> expert-major flat positions e * tokens + t of the chosen pairs,
        # in masked_select's order (a stable sort keeps ascending positions among equals)
        flat = routing_map.T.reshape(-1).to(torch.int8)
        chosen = torch.argsort(flat, descending=True, stable=True)[:num_out_tokens]
        sorted_indices = chosen % num_tokens
        permuted_probs = None
        if probs is not None:
            permuted_probs = probs.T.contiguous().view(-1).index_select(0, chosen)
        out = tokens.index_select(0, sorted_indices), permuted_probs, sorted_indices
        # megatron-core 0.19+: (..., pad_offsets, tokens_per_expert), None unless it padded
        return (*out, None, None) if five else out

    permute.kit_sync_free = True  # type: ignore[attr-defined]
    return permute
