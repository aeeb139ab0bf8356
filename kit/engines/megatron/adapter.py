"""The one place that knows how megatron-core versions differ (0.16 through 0.19).

Everything else in the engine calls these functions instead of megatron-core APIs whose
signatures moved between releases.
"""

import inspect
from functools import lru_cache
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
