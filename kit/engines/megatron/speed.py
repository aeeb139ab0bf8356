"""The GPU speed path of the megatron engine, without Transformer Engine.

megatron-core's local spec is written for correctness, not speed: un-fused bias + activation,
an fp32 cross-entropy built from several kernels over the whole logits tensor, and a torch
AdamW in its multi-tensor (not fused) form when neither TE nor apex is importable, and every
weight gradient written in bf16 and then added into the fp32 ``main_grad`` by a separate
kernel (apex's fused accumulation is missing). This module turns on megatron-core's own
native fusions, gives it a torch-only weight-gradient accumulation, replaces its fused
cross-entropy with :mod:`kit.engines.kernels.cross_entropy` (fewer passes over the logits),
captures the forward and backward of a whole step in one CUDA graph
(:mod:`kit.engines.megatron.step_graph`: the CPU no longer paces ~5000 kernel launches per
step), makes the optimizer torch's fused AdamW and its gradient norm, clipping and parameter
copies torch foreach kernels (:mod:`kit.engines.megatron.foreach_ops`). With ``fusions`` the
QKV projection adds its bias in one compiled kernel. With ``grouped_gemm`` a bias-free MoE
layer runs its experts as grouped GEMMs (:mod:`kit.engines.megatron.grouped_mlp`) instead of
megatron-core's per-expert loop; with ``sync_free_permute`` (off by default until measured)
the dropless token permutation needs no device-to-host wait
(:mod:`kit.engines.megatron.moe_permute`). ``torch.compile`` of the layers is
available but off by default: on megatron-core's layers it hits graph breaks and measured
slower (see ``benchmarks/results/engine_throughput-*.txt``).
"""

from typing import Any

import torch

from kit.config.run import RunConfig
from kit.engines.kernels.compiled import compile_modules


def config_kwargs(cfg: RunConfig, features: frozenset[str]) -> dict[str, Any]:
    """TransformerConfig fields for the chosen features (megatron-core's non-TE fusions)."""
    kwargs: dict[str, Any] = {}
    if "fusions" in features:
        w = cfg.workload
        kwargs.update(
            bias_activation_fusion=(w.activation == "gelu" and w.add_bias_linear)
            or w.activation == "swiglu",
            cross_entropy_loss_fusion=True,
            cross_entropy_fusion_impl="native",
        )
    if "wgrad_fusion" in features:
        kwargs["gradient_accumulation_fusion"] = True
    return kwargs


class WgradAccumulation:
    """apex's ``fused_weight_gradient_mlp_cuda`` interface, on ``torch.addmm``.

    megatron-core calls it in the backward of every linear layer when
    ``gradient_accumulation_fusion`` is set: the weight-gradient GEMM adds straight into
    ``main_grad`` (bf16 inputs, fp32 accumulation and output in cuBLAS), so no bf16 gradient
    is written, read back and added. Inputs are 2-D: ``total_input`` [tokens, in],
    ``grad_output`` [tokens, out], ``main_grad`` [out, in].
    """

    @staticmethod
    def wgrad_gemm_accum_fp32(
        total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor
    ) -> None:
        """``main_grad += grad_output^T @ total_input`` with an fp32 ``main_grad``."""
        torch.addmm(main_grad, grad_output.t(), total_input, out_dtype=torch.float32,
                    out=main_grad)

    @staticmethod
    def wgrad_gemm_accum_fp16(
        total_input: torch.Tensor, grad_output: torch.Tensor, main_grad: torch.Tensor
    ) -> None:
        """The same with a bf16/fp16 ``main_grad``."""
        main_grad.addmm_(grad_output.t(), total_input)


def compile_layers(chunks: list[torch.nn.Module]) -> int:
    """``torch.compile`` every transformer layer in place; returns how many were compiled."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    return compile_modules(chunks, TransformerLayer)


def use_fused_adamw(optimizer: Any) -> int:
    """Switch the torch Adam/AdamW inside a megatron-core optimizer to the fused kernel.

    Without TE or apex megatron-core builds ``torch.optim.AdamW`` in its default multi-tensor
    form; torch reads ``fused`` per parameter group at every step, so setting it afterwards is
    enough. Returns the number of torch optimizers switched.
    """
    inner = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    count = 0
    for opt in inner:
        torch_opt = getattr(opt, "optimizer", None)
        if isinstance(torch_opt, torch.optim.Adam | torch.optim.AdamW):
            for group in torch_opt.param_groups:
                group["fused"], group["foreach"] = True, False
            count += 1
    return count
