"""Build a megatron-core GPTModel from a workload spec with the kit's own layer spec.

The layer spec is megatron-core's local spec with its core attention swapped for
:class:`~kit.engines.megatron.attention.SDPAttention`, so no Transformer Engine is needed.
"""

from typing import Any

import torch
import torch.nn.functional as F

from kit.config.run import RunConfig
from kit.config.workload import padded_vocab_size
from kit.engines.megatron import adapter, features, speed

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def transformer_config(cfg: RunConfig) -> Any:
    """The megatron-core ``TransformerConfig`` for ``cfg``."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    w, p, o = cfg.workload, cfg.parallel, cfg.optim
    cpu = cfg.platform.is_cpu
    kwargs: dict[str, Any] = dict(
        num_layers=w.num_layers,
        hidden_size=w.hidden_size,
        num_attention_heads=w.num_attention_heads,
        num_query_groups=w.query_groups,
        ffn_hidden_size=w.ffn_hidden_size,
        kv_channels=w.hidden_size // w.num_attention_heads,
        tensor_model_parallel_size=p.tp,
        pipeline_model_parallel_size=p.pp,
        virtual_pipeline_model_parallel_size=p.vpp,
        context_parallel_size=p.cp,
        expert_model_parallel_size=p.ep,
        sequence_parallel=p.sp,
        gated_linear_unit=w.activation == "swiglu",
        activation_func=F.silu if w.activation == "swiglu" else F.gelu,
        normalization="RMSNorm" if w.normalization == "rmsnorm" else "LayerNorm",
        add_bias_linear=w.add_bias_linear,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        params_dtype=_DTYPES[cfg.dtype],
        bf16=cfg.dtype == "bf16",
        fp16=cfg.dtype == "fp16",
        pipeline_dtype=_DTYPES[cfg.dtype],
        use_cpu_initialization=cpu,
        perform_initialization=True,
        bias_dropout_fusion=not cpu,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )
    kwargs.update(speed.config_kwargs(cfg, features.enabled(cfg)))
    if o.recompute != "none":
        kwargs["recompute_granularity"] = o.recompute
        if o.recompute == "full":
            kwargs.update(recompute_method=o.recompute_method, recompute_num_layers=1)
    if w.is_moe:
        kwargs.update(
            num_moe_experts=w.num_experts,
            moe_router_topk=w.moe_top_k,
            moe_token_dispatcher_type=p.moe_dispatcher,
            moe_expert_capacity_factor=w.moe_capacity_factor,
            moe_pad_expert_input_to_capacity=w.moe_pad_to_capacity,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-2,
            moe_grouped_gemm=False,
        )
    if cpu:
        from kit.engines.megatron.cpu_compat import cpu_config_overrides

        kwargs.update(cpu_config_overrides())
    return TransformerConfig(**kwargs)


def layer_spec(cfg: RunConfig) -> Any:
    """megatron-core's local layer spec with SDPA core attention.

    With the ``fusions`` speed feature the QKV projection adds its bias in a compiled kernel
    (:class:`~kit.engines.megatron.linears.BiasAddColumnParallelLinear`); with
    ``grouped_gemm`` a bias-free MoE layer runs its experts as grouped GEMMs
    (:class:`~kit.engines.megatron.grouped_mlp.GroupedMLP`).
    """
    from megatron.core.transformer.spec_utils import ModuleSpec

    from kit.engines.megatron.attention import SDPAttention

    w = cfg.workload
    spec = adapter.local_layer_spec(w.num_experts, rms_norm=w.normalization == "rmsnorm")
    attention = spec.submodules.self_attention.submodules
    attention.core_attention = ModuleSpec(module=SDPAttention)
    if "fusions" in features.enabled(cfg) and w.add_bias_linear:
        from kit.engines.megatron.linears import BiasAddColumnParallelLinear

        attention.linear_qkv = BiasAddColumnParallelLinear
    if features.use_grouped_gemm(cfg, features.enabled(cfg)):
        from kit.engines.megatron.grouped_mlp import GroupedMLP

        adapter.use_experts(spec, GroupedMLP)
    return spec


def decoder_spec(cfg: RunConfig, config: Any, vp_stage: int | None) -> Any:
    """The decoder spec of one model chunk: the layer spec, or under SP a block spec.

    The block spec puts :class:`~kit.engines.megatron.norms.SequenceParallelNorm` in every
    layer and as the final norm (megatron-core's torch fallback norm refuses SP).
    """
    spec = layer_spec(cfg)
    if not cfg.parallel.sp:
        return spec
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import (
        TransformerBlock,
        TransformerBlockSubmodules,
    )

    from kit.engines.megatron.norms import SequenceParallelNorm

    layer = spec.submodules
    layer.input_layernorm = layer.pre_mlp_layernorm = SequenceParallelNorm
    count = adapter.num_layers_to_build(config, vp_stage)
    return ModuleSpec(
        module=TransformerBlock,
        submodules=TransformerBlockSubmodules(
            layer_specs=[spec] * count, layer_norm=SequenceParallelNorm
        ),
    )


def build_model_chunks(cfg: RunConfig, config: Any) -> list[torch.nn.Module]:
    """One GPTModel per virtual pipeline stage held by this rank (one without VPP)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel

    w = cfg.workload
    vocab = padded_vocab_size(w.vocab_size, cfg.parallel.tp)
    chunks = []
    for vp_stage in range(cfg.parallel.vpp or 1):
        vp = vp_stage if cfg.parallel.vpp else None
        extra = {"vp_stage": vp} if cfg.parallel.vpp else {}
        model = GPTModel(
            config=config,
            transformer_layer_spec=decoder_spec(cfg, config, vp),
            vocab_size=vocab,
            max_sequence_length=w.seq_length,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=w.tie_embeddings,
            position_embedding_type=w.position_embedding,
            rotary_base=int(w.rope_theta),
            **extra,
        )
        chunks.append(model)
    return chunks
