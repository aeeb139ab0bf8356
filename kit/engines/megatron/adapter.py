"""The one place that knows how megatron-core versions differ (0.16 through 0.19).

Everything else in the engine calls these functions instead of megatron-core APIs whose
signatures moved between releases.
"""

import inspect
from functools import lru_cache, partial
from typing import Any

from packaging.version import Version

SUPPORTED = (Version("0.16"), Version("0.20"))


@lru_cache(maxsize=1)
def mcore_version() -> Version:
    """Installed megatron-core version; refuses one outside the supported range."""
    from importlib.metadata import version

    v = Version(version("megatron-core"))
    if not SUPPORTED[0] <= v < SUPPORTED[1]:
        raise RuntimeError(f"megatron-core {v} is not supported; install >=0.16,<0.20")
    return v


def local_layer_spec(num_experts: int | None, rms_norm: bool) -> Any:
    """megatron-core's local (no Transformer Engine) GPT layer spec."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    params = inspect.signature(get_gpt_layer_local_spec).parameters
    kwargs: dict[str, Any] = {"num_experts": num_experts, "moe_grouped_gemm": False}
    if "normalization" in params:
        kwargs["normalization"] = "RMSNorm" if rms_norm else "LayerNorm"
    return get_gpt_layer_local_spec(**kwargs)


def _moe_submodules(spec: Any) -> Any:
    """The ``MoESubmodules`` of a MoE layer spec from :func:`local_layer_spec`.

    0.16's MoE spec is a ``ModuleSpec(module=MoELayer, submodules=...)``, 0.19's a
    ``functools.partial(MoELayer, submodules=...)``.
    """
    mlp = spec.submodules.mlp
    return mlp.keywords["submodules"] if isinstance(mlp, partial) else mlp.submodules


def use_experts(spec: Any, experts: type) -> None:
    """Make the MoE layer of ``spec`` build ``experts``.

    Both releases build the experts as ``experts(num_local_experts, config,
    pg_collection=...)`` (0.19 adds ``name=``), a class being a valid builder in both.
    """
    _moe_submodules(spec).experts = experts


def build_experts(spec: Any, num_local_experts: int, config: Any, pg_collection: Any) -> Any:
    """The experts module that the MoE layer of ``spec`` would build (a ``SequentialMLP`` in
    the local spec): 0.16 holds a ``ModuleSpec`` for it, 0.19 a ``functools.partial``."""
    from megatron.core.transformer.spec_utils import build_module

    experts = _moe_submodules(spec).experts
    build = experts if isinstance(experts, partial) else partial(build_module, experts)
    return build(num_local_experts, config, pg_collection=pg_collection)


def initialize_model_parallel(tp: int, pp: int, cp: int, ep: int, vpp: int | None) -> None:
    """Create megatron-core's process groups for this layout."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
    )


def forward_backward_kwargs(forward_backward_func: Any) -> dict[str, Any]:
    """Keyword arguments of the schedule call that older releases lack."""
    params = inspect.signature(forward_backward_func).parameters
    return {"decoder_seq_length": None} if "decoder_seq_length" in params else {}


def install_wgrad_accumulation(impl: Any) -> None:
    """Make megatron-core's linear layers use ``impl`` for fused weight-gradient accumulation.

    megatron-core imports apex's ``fused_weight_gradient_mlp_cuda`` into
    ``megatron.core.tensor_parallel.layers`` (0.16 through 0.19) and refuses
    ``gradient_accumulation_fusion`` when the import failed; both are module globals there.
    Must run before the model's layers are built.
    """
    from megatron.core.tensor_parallel import layers

    layers.fused_weight_gradient_mlp_cuda = impl
    layers._grad_accum_fusion_available = True


_MEGATRON_CROSS_ENTROPY: list[Any] = []


def use_cross_entropy(impl: Any | None) -> None:
    """Make megatron-core's fused cross-entropy ``impl`` (``None``: megatron-core's own).

    ``language_module`` imports ``fused_vocab_parallel_cross_entropy`` as a module global and
    calls it as ``(logits, labels, tp_group)`` when ``cross_entropy_fusion_impl == "native"``
    (0.16 through 0.19). The original is kept so a later model in the same process can go back.
    """
    from megatron.core.models.common.language_module import language_module

    if not _MEGATRON_CROSS_ENTROPY:
        _MEGATRON_CROSS_ENTROPY.append(language_module.fused_vocab_parallel_cross_entropy)
    language_module.fused_vocab_parallel_cross_entropy = impl or _MEGATRON_CROSS_ENTROPY[0]


_MEGATRON_PERMUTE: list[Any] = []


def use_sync_free_permute(enabled: bool) -> None:
    """Make megatron-core's MoE dispatchers permute tokens without a host wait, or not.

    ``enabled``: through :func:`kit.engines.megatron.moe_permute.sync_free_permute`; False
    puts megatron-core's own back.

    ``token_dispatcher`` imports ``permute`` from ``moe_utils`` as a module global and calls it
    as ``permute(tokens, routing_map, probs=..., num_out_tokens=..., fused=...,
    drop_and_pad=...)`` (0.16 through 0.19); both globals are replaced, the original is kept.
    """
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    from kit.engines.megatron.moe_permute import sync_free_permute

    if not _MEGATRON_PERMUTE:
        _MEGATRON_PERMUTE.append(moe_utils.permute)
    impl = sync_free_permute(_MEGATRON_PERMUTE[0]) if enabled else _MEGATRON_PERMUTE[0]
    moe_utils.permute = token_dispatcher.permute = impl


_MEGATRON_MULTI_TENSOR: dict[str, Any] = {}


def use_foreach_multi_tensor_ops(enabled: bool) -> None:
    """Use :mod:`kit.engines.megatron.foreach_ops` for megatron-core's per-tensor fallbacks.

    ``enabled=False`` puts the fallbacks back.

    ``clip_grads`` binds ``l2_norm_impl`` and ``multi_tensor_scale_impl`` and ``optimizer``
    binds ``multi_tensor_scale_impl`` as module globals at import (0.16 through 0.19), to
    Transformer Engine's or apex's kernels when importable, else to ``megatron.core.utils``'s
    local loops; only the local loops are replaced.
    """
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    from kit.engines.megatron import foreach_ops

    slots = {(clip_grads, "l2_norm_impl"): (utils.local_multi_tensor_l2_norm,
                                            foreach_ops.l2_norm),
             (clip_grads, "multi_tensor_scale_impl"): (utils.local_multi_tensor_scale,
                                                       foreach_ops.scale),
             (optimizer, "multi_tensor_scale_impl"): (utils.local_multi_tensor_scale,
                                                      foreach_ops.scale)}
    for (module, name), (local, kit) in slots.items():
        if getattr(module, name) in (local, kit):
            setattr(module, name, kit if enabled else local)


def num_layers_to_build(config: Any, vp_stage: int | None) -> int:
    """Transformer layers of this rank's (virtual) pipeline stage."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    return get_num_layers_to_build(config, vp_stage=vp_stage)


def megatron_fsdp_ddp_config_kwargs(cpu: bool) -> dict[str, Any]:
    """``DistributedDataParallelConfig`` fields that select Megatron-FSDP (full sharding).

    Both releases shard optimizer states, gradients and parameters with
    ``data_parallel_sharding_strategy="optim_grads_params"`` and need
    ``use_distributed_optimizer`` (megatron-core's optimizer has a Megatron-FSDP path only in
    its distributed optimizer), which the caller sets. They differ in how
    gradients are kept in fp32: 0.16 reads ``grad_reduce_in_fp32`` (and keeps fp32 main weights
    with ``preserve_fp32_weights``, its default); 0.19 ignores ``grad_reduce_in_fp32`` under
    Megatron-FSDP and takes ``megatron_fsdp_main_grads_dtype`` (main weights default to fp32).
    With ``cpu`` the gradient division is not fused into the reduction: the fused form is
    NCCL's ``PREMUL_SUM``, which gloo lacks (the field and its meaning are the same in both).
    """
    import dataclasses

    import torch
    from megatron.core.distributed import DistributedDataParallelConfig

    kwargs: dict[str, Any] = {
        "use_megatron_fsdp": True,
        "data_parallel_sharding_strategy": "optim_grads_params",
    }
    fields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    if "megatron_fsdp_main_grads_dtype" in fields:
        kwargs["megatron_fsdp_main_grads_dtype"] = torch.float32
    if cpu:
        kwargs["gradient_reduce_div_fusion"] = False  # scale, then sum: the same gradients
    return kwargs


class _NoTransformerEngineLinear:
    """Stands for Transformer Engine's ``TELinear`` where TE is absent: nothing is one."""


def megatron_fsdp_wrapper() -> Any:
    """megatron-core's Megatron-FSDP module wrapper (the same import path in 0.16 and 0.19).

    0.16 tags tensor-parallel params with ``isinstance(module, TELinear)``, and without
    Transformer Engine its ``TELinear`` is a mock, so any ``--tp > 1`` raises ``TypeError``;
    it becomes a class no module is an instance of (what the check means without TE). 0.19
    classifies modules by name and imports no ``TELinear`` there.
    """
    from megatron.core.distributed.fsdp import mcore_fsdp_adapter

    if not isinstance(getattr(mcore_fsdp_adapter, "TELinear", type), type):
        mcore_fsdp_adapter.TELinear = _NoTransformerEngineLinear
    return mcore_fsdp_adapter.FullyShardedDataParallel


MEGATRON_FSDP_ONE_RANK_DOUBLE_COUNT_FIXED = Version("0.19")
"""First release checked not to add a one-rank Megatron-FSDP gradient buffer into itself."""


def megatron_fsdp_one_rank_group_flaw(dp: int) -> str | None:
    """Why Megatron-FSDP trains wrongly over a data-parallel group of one rank (None if not).

    Over one rank its gradient buffer is not sharded: the bucket is the buffer itself and is
    reduced (and rescaled) after every micro-batch's backward. 0.16.1 then adds the reduced
    bucket back into the buffer, so gradients double at each micro-batch (a ``--dp 1`` run
    departs from plain DDP at the second step). 0.19.2 no longer adds it back, but still
    multiplies the whole accumulated buffer by the scaling factor ``1/dp`` each time: right
    for a dense model at ``dp == 1`` (factor 1), wrong for an expert group of one rank inside
    a larger DP (earlier micro-batches count less; checked on CPU: losses depart from plain
    DDP at the second step). 0.17 and 0.18 were not checked and count as 0.16.

    Args:
        dp: the data-parallel size the gradients are averaged over.
    """
    if mcore_version() < MEGATRON_FSDP_ONE_RANK_DOUBLE_COUNT_FIXED:
        return (f"megatron-core {mcore_version()} adds each micro-batch's gradients into "
                "themselves there (fixed by 0.19)")
    if dp > 1:
        return (f"megatron-core {mcore_version()} rescales the accumulated gradients by 1/dp "
                "after every micro-batch there, so earlier micro-batches count less")
    return None
