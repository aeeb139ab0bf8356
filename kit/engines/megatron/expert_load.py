"""Tokens routed to each expert, per MoE layer, counted on the device and read once per step.

A forward hook on every megatron-core router adds its routing map's column sums (this rank's
tokens per expert, before any dispatch) into one ``[layers, experts]`` int64 tensor on the
rank's device: no host synchronization per layer or micro-batch, one small copy to the host
when the step's counts are read (after the step's loss, which synchronizes anyway).

A router whose experts take a fixed capacity (``moe_pad_expert_input_to_capacity``) returns
each expert's capacity slots as its routing map, tokens routed there or not; the tokens kept
are those with a nonzero routing probability, which are counted instead. Tokens dropped at
capacity are then the routed tokens (``top_k`` per token) less the counted ones
(:mod:`kit.metrics.expert_load`).

Every count is a device operation, so a step captured in a CUDA graph replays them.

Only passes with autograd on are counted: a plain forward counts each micro-batch once, and
under full activation recomputation the first forward runs without autograd and the
recomputation in the backward with it, so each micro-batch is still counted once.
"""

from typing import Any

import torch


class ExpertLoad:
    """Per-step routed-token counts of the MoE layers held by this rank.

    Args:
        chunks: This rank's model chunks; their routers are found by type.
        num_experts: Experts per MoE layer (the router's output width).
        device: Where the counts accumulate (the rank's compute device).
        padded: Whether experts' inputs are padded to capacity (count nonzero probabilities).
    """

    def __init__(self, chunks: list[torch.nn.Module], num_experts: int,
                 device: torch.device, padded: bool = False) -> None:
        from megatron.core.transformer.moe.router import Router

        routers = [m for chunk in chunks for m in chunk.modules() if isinstance(m, Router)]
        self.layers = [int(r.layer_number) for r in routers]
        """Global layer numbers (1-based, megatron-core's ``layer_number``) of the routers."""
        self._counts = torch.zeros(len(routers), num_experts, dtype=torch.int64, device=device)
        self._padded = padded
        self._handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(routers)]

    def _hook(self, row: int) -> Any:
        def count(module: torch.nn.Module, inputs: Any, output: tuple[Any, Any]) -> None:
            if torch.is_grad_enabled():
                probs, routing_map = output  # [tokens, experts]: float, bool
                kept = probs != 0 if self._padded else routing_map
                self._counts[row] += kept.sum(dim=0)
        return count

    def read(self) -> dict[str, list[int]]:
        """Counts since the last read, by layer number (as a string), and start over."""
        rows = self._counts.tolist()
        self._counts.zero_()
        return {str(layer): row for layer, row in zip(self.layers, rows, strict=True)}

    def remove(self) -> None:
        """Take the hooks off the routers."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
