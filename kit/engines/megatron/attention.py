"""Core attention for megatron-core layers built on PyTorch's ``scaled_dot_product_attention``.

megatron-core's local ``DotProductAttention`` materializes the full score matrix with
``baddbmm`` (and needs CUDA for its buffers); SDPA dispatches to flash / memory-efficient
kernels on NVIDIA and ROCm and to a fused kernel on CPU, and handles grouped-query attention
natively (``enable_gqa``), so key/value heads are never repeated in memory.
"""

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from kit.engines.megatron import context_parallel


class SDPAttention(MegatronModule):
    """Drop-in ``core_attention`` for megatron-core's ``SelfAttention`` (causal, no dropout mask).

    Inputs follow megatron's layout: query ``[sq, b, np, hn]``, key/value ``[sk, b, ng, hn]``
    (per tensor-parallel partition); output ``[sq, b, np * hn]``.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: object,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: object | None = None,
        **_: object,
    ) -> None:
        super().__init__(config=config)
        tp = pg_collection.tp.size() if pg_collection is not None else _tp_size()
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        self.head_dim = config.kv_channels
        self.scale = softmax_scale or 1.0 / math.sqrt(self.head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.cp_group = None
        if config.context_parallel_size > 1:
            self.cp_group = getattr(pg_collection, "cp", None) or _cp_group()

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: object = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: object = None,
    ) -> torch.Tensor:
        """Causal attention; ``attention_mask`` is ignored (the kit trains causal LMs only).

        Under context parallelism the local queries attend to the keys and values of the whole
        sequence (:mod:`kit.engines.megatron.context_parallel`).
        """
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SDPAttention supports neither packed sequences nor bias")
        sq, b = query.shape[0], query.shape[1]
        sdpa = dict(dropout_p=self.dropout if self.training else 0.0, scale=self.scale,
                    enable_gqa=self.heads != self.groups)
        if self.cp_group is not None:  # keys and values of the whole sequence
            out = context_parallel.attention(query, key, value, self.cp_group, **sdpa)
        else:
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, hn]
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **sdpa)
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.heads * self.head_dim)


def _cp_group() -> object:
    from megatron.core import parallel_state

    return parallel_state.get_context_parallel_group()


def _tp_size() -> int:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_world_size()
