"""The GPU speed path of the deepspeed engine: the kit's fast layers where DeepSpeed allows them.

DeepSpeed wraps whatever ``nn.Module`` it is given, so the engine's plain PyTorch model can take
two of the megatron engine's levers: ``compile`` runs ``torch.compile`` on every transformer
block (Inductor fuses LayerNorm, bias, GELU and residual adds into a few Triton kernels; the
blocks share one graph), ``cross_entropy`` replaces the fp32 cross-entropy over the whole logits
tensor with :mod:`kit.engines.kernels.cross_entropy` (two reads and one write of the bf16
logits). The megatron engine's other features (weight-gradient accumulation into ``main_grad``,
the step CUDA graph, foreach optimizer ops) act on megatron-core's own buffers and optimizer,
which DeepSpeed replaces with its own; its optimizer already is torch's fused AdamW.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from kit.config.run import RunConfig
from kit.engines.deepspeed.spec import SPEED_FEATURES
from kit.engines.kernels.cross_entropy import vocab_parallel_cross_entropy
from kit.engines.kernels.features import chosen_features

DEFAULT = frozenset(SPEED_FEATURES)
"""On by default on NVIDIA GPUs: together 4.5% faster at ZeRO-1 on one H100
(``benchmarks/deepspeed/results/speed-h100.txt``)."""

DEFAULT_AMD = frozenset({"cross_entropy"})
"""On ROCm only the fused cross-entropy: ``compile`` of the blocks was measured on CUDA only (no
AMD GPU was reachable), so it stays off until a ROCm run shows it pays."""


def compile_blockers(cfg: RunConfig) -> list[str]:
    """Why ``compile`` stays out of this layout's default set (empty when it is in).

    Compiled blocks measured slower under ZeRO-3 (0.30x the megatron engine against 0.39x
    uncompiled: its gather/release hooks run around every block). DeepSpeed's pipeline engine
    and its MoE layer (data-dependent token counts) have not been measured compiled.
    ``--speed compile`` still turns it on.
    """
    return [reason for blocked, reason in (
        (cfg.optim.zero == 3, "ZeRO-3 (measured slower)"),
        (cfg.parallel.pp > 1, "DeepSpeed's pipeline engine (not measured)"),
        (cfg.workload.is_moe, "mixture of experts (not measured)"),
    ) if blocked]


def enabled(cfg: RunConfig) -> frozenset[str]:
    """The speed features for ``cfg``: :data:`DEFAULT` on NVIDIA, :data:`DEFAULT_AMD` on AMD,
    none on CPU, without ``compile`` where :func:`compile_blockers` says so; the run's
    ``--speed`` (checked by the spec) overrides the default."""
    chosen = chosen_features(cfg, DEFAULT, DEFAULT_AMD)
    if cfg.speed is None and compile_blockers(cfg):
        return chosen - {"compile"}
    return chosen


def plain_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over every token, the logits cast to fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def fused_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The same mean through the kit's fused cross-entropy (fp32 loss, bf16 logits kept)."""
    return vocab_parallel_cross_entropy(logits, labels).mean()


def loss_function(features: frozenset[str]) -> Callable[[torch.Tensor, torch.Tensor],
                                                        torch.Tensor]:
    """The language-model loss the model computes under ``features``."""
    return fused_loss if "cross_entropy" in features else plain_loss
