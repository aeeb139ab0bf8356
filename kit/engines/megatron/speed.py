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

from kit.engines.kernels.compiled import compile_modules
from kit.engines.kernels.features import chosen_features
from kit.engines.megatron.spec import SPEED_FEATURES as FEATURES
from kit.spec.run import RunConfig

DEFAULT = frozenset(FEATURES) - {"compile", "sync_free_permute"}

DEFAULT_AMD = DEFAULT - {"wgrad_fusion", "cuda_graph", "grouped_gemm"}
"""On ROCm: ``wgrad_fusion`` needs ``torch.addmm(..., out_dtype=float32)``, ``cuda_graph``
HIP graph capture of megatron-core's step and ``grouped_gemm`` torch's ``_grouped_mm`` kernel
(CUTLASS on CUDA); all were checked on CUDA only (no AMD GPU was reachable), so they stay off
until a ROCm run shows they work."""


NOT_WITH_FSDP = frozenset({"wgrad_fusion"})
"""Off under ``--fsdp``: megatron-core 0.19's Megatron-FSDP refuses
``gradient_accumulation_fusion`` unless Transformer Engine >= 2.10 provides it."""


def enabled(cfg: RunConfig) -> frozenset[str]:
    """The speed features for ``cfg``.

    :data:`DEFAULT` on NVIDIA, :data:`DEFAULT_AMD` on AMD, none on CPU, less
    :data:`NOT_WITH_FSDP` under ``--fsdp``. The run's ``--speed`` (a subset of
    :data:`~kit.engines.megatron.spec.SPEED_FEATURES`, checked by the spec, or ``none``)
    overrides the default, for measuring what each feature buys.
    """
    chosen = chosen_features(cfg, DEFAULT, DEFAULT_AMD)
    return chosen - NOT_WITH_FSDP if cfg.optim.fsdp else chosen


def graph_blockers(cfg: RunConfig) -> list[str]:
    """Why one CUDA graph cannot hold this layout's step (empty when it can).

    Capture replays GPU work only: Python that runs between kernels on every step (pipeline
    send/receive bookkeeping, MoE token counts read on the host, activation recomputation's
    RNG juggling) would be frozen at its first run, so such layouts keep the eager step.
    Overlapped gradient reduction (``--overlap``) is captured: its backward hooks launch each
    bucket's asynchronous reduce-scatter or all-reduce in the same order every step, and the
    schedule's ``finish_grad_sync`` joins them back into the captured stream. Its companion,
    the distributed optimizer's overlapped parameter all-gather, is not: the forward hooks that
    wait for it would wait, on replay, for nothing (the gather runs eagerly after the optimizer
    step), so under a graph the all-gather stays in the optimizer step (the engine's notes say
    so); eager, --overlap kept the step at 0.46-0.49 s against 0.29 s for DP2 on two H200s.
    NCCL collectives are capturable (PyTorch's ProcessGroupNCCL skips its
    watchdog bookkeeping while a stream captures): the graph holds the tensor-parallel
    all-reduces and sequence-parallel gathers and scatters of the forward and backward, and
    megatron-core's gradient reduction over data parallelism (``finalize_model_grads``, run at
    the end of the schedule), so TP, SP, DP and the distributed optimizer's reduce-scatter are
    replayed; the optimizer step (and the distributed optimizer's parameter all-gather) stays
    eager. Context parallelism is captured too: its attention's key/value all-gathers and
    their reduce-scatters are NCCL collectives, the CP loss average an all-reduce, and its
    chunk indices are cached device tensors (:mod:`kit.engines.megatron.context_parallel`);
    left eager, gpt3-1.3b CP2 x TP2 + SP ran 1.946 s a step with the GPU 89% idle.
    """
    p, o, w = cfg.parallel, cfg.optim, cfg.workload
    return [reason for blocked, reason in (
        (p.pp > 1, "pipeline parallelism"),
        (w.is_moe, "mixture of experts"),
        (o.recompute != "none", "activation recomputation"),
        (o.fsdp, "FSDP"),
    ) if blocked]


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


def use_grouped_gemm(cfg: RunConfig, features: frozenset[str]) -> bool:
    """Whether this run's MoE layers use grouped expert GEMMs (feature on, MoE, no biases)."""
    w = cfg.workload
    return "grouped_gemm" in features and w.is_moe and not w.add_bias_linear


def use_cuda_graph(cfg: RunConfig, features: frozenset[str]) -> bool:
    """Whether this run captures its step in a CUDA graph (feature on and layout capturable)."""
    return "cuda_graph" in features and not graph_blockers(cfg)


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
