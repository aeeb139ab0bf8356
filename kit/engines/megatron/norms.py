"""Layer norms for sequence-parallel layers without Transformer Engine or Apex.

megatron-core's torch fallback (``WrappedTorchNorm``) refuses ``sequence_parallel``: under SP
each tensor-parallel rank normalizes its own slice of the sequence, so the norm's weight and
bias gradients are partial sums that must be all-reduced over the TP group. megatron-core does
that for every parameter tagged ``sequence_parallel=True`` (``finalize_model_grads``). This
norm is torch's ``LayerNorm`` / ``RMSNorm`` with that tag, so SP runs on any device.
"""

import torch
from megatron.core.transformer.transformer_config import TransformerConfig


class SequenceParallelNorm:
    """Build torch's LayerNorm or RMSNorm (per ``config.normalization``), tagged for SP."""

    def __new__(
        cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_: object
    ) -> torch.nn.Module:
        """Return the norm module (the class is a factory, as megatron's specs expect)."""
        if config.normalization == "RMSNorm":
            norm: torch.nn.Module = torch.nn.RMSNorm(hidden_size, eps=eps)
        elif config.normalization == "LayerNorm":
            norm = torch.nn.LayerNorm(hidden_size, eps=eps)
        else:
            raise ValueError(f"normalization {config.normalization} has no SP norm here")
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel  # type: ignore[attr-defined]
        return norm
