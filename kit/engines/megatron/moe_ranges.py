"""Name the stages of megatron-core's MoE layers in profiles (``run --profile`` only).

Kernel names cannot tell a router's GEMM from an attention projection's, or a permutation's
gather from any other copy. Under the profiler each MoE layer's stages run inside
``record_function`` ranges named ``moe:<stage>`` (:data:`STAGES`); the operators they launch
carry the range in the trace, and autograd's backward nodes carry the forward operator's
sequence number, so :mod:`kit.metrics.moe_breakdown` can give forward and backward kernels
to their stage. Unprofiled runs are left untouched (a range costs host time per call).
"""

from functools import wraps
from typing import Any

import torch
from torch.profiler import record_function

STAGES = {
    "route": "moe:router",
    "preprocess": "moe:permute",
    "dispatch": "moe:dispatch",
    "routed_experts_compute": "moe:expert_stage",
    "combine": "moe:combine",
    "postprocess": "moe:unpermute",
}
"""``MoELayer`` method -> range name (megatron-core 0.16 through 0.19 split the layer's forward
into these methods; one a release lacks is skipped). ``moe:expert_stage`` holds the
dispatcher's per-expert sorting around the experts; the experts' own forward is
:data:`EXPERTS`."""
EXPERTS = "moe:experts"
"""Range of the experts module's forward (the expert MLPs: grouped GEMMs or per-expert loop)."""


def _ranged(method: Any, name: str) -> Any:
    @wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with record_function(name):
            return method(*args, **kwargs)
    return call


def label_moe_stages(chunks: list[torch.nn.Module]) -> int:
    """Wrap the stage methods of every MoE layer in ``chunks``; returns the layers labelled."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    layers = [m for chunk in chunks for m in chunk.modules() if isinstance(m, MoELayer)]
    for layer in layers:
        for method, name in STAGES.items():
            if hasattr(layer, method):
                setattr(layer, method, _ranged(getattr(layer, method), name))
        layer.experts.forward = _ranged(layer.experts.forward, EXPERTS)
    return len(layers)
