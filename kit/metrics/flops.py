"""Model FLOPs per training step (Megatron-LM's definition) and parameter counts.

Model FLOPs follow Megatron-LM's ``num_floating_point_operations`` (function
``transformer_flops``, standard-attention branch) in ``megatron/training/training.py``,
NVIDIA/Megatron-LM commit ``001b00c2734d8f0fad096fe48a382fedf755d321``, restricted to what a
:class:`~kit.config.workload.WorkloadSpec` can describe: no multi-latent attention, no
multi-token prediction, no shared experts, no latent MoE, no linear attention, no attention
output gate, every layer's MLP a MoE when the workload has experts (``moe_layer_freq`` 1).

Symbols: ``B`` samples per step (global batch), ``s`` sequence length, ``L`` layers, ``h``
hidden size, ``n`` attention heads, ``g`` key/value groups, ``d = h / n`` (megatron's default
``kv_channels``), ``q = d n`` query projection width, ``kv = d g`` key (and value) projection
width, ``f`` FFN hidden size (per expert), ``k`` experts each token is routed to (1 when
dense), ``e = 3`` for a gated MLP (SwiGLU: h->2f and f->h GEMMs) else ``2`` (h->f and f->h),
``V`` vocabulary padded by :func:`kit.config.workload.padded_vocab_size`::

    F = 3 * 2 * B * s * ( L * [ h (q + 2 kv)        QKV projection (grouped-query)
                              + q s                 QK^T and (QK^T)V: 2 GEMMs x s/2 (causal)
                              + q h                 attention output projection
                              + e h f k ]           MLP, routed experts
                          + h V )                   logits

The leading 3 counts forward, backward-data and backward-weight GEMMs; the 2 counts a
multiply-add as two operations. The router GEMM (h x experts), norms, softmax and other
element-wise work are not counted (Megatron's formula leaves them out).

Causal masking: current Megatron-LM counts the two attention GEMMs over half the ``s x s``
score matrix (``q * s / 2 * 2``; already so at commit ``250b794``, July 2025, as cited in
AI-Hypercomputer/maxtext issue 1972), as implemented here. Older releases (e.g. commit
``86df799dc4c78e4bd7fbae972b3ee743e8b14f02``, 2024) wrote the same formula as
``12 B s L h^2 [(1 + g/n + s/h) q/h + k f/h (3/2 if gated) + V / (2 L h)]``, which is
identical except that its attention-score term is twice ours (``2 q s``, no causal halving);
numbers from such logs are higher by ``6 B s L q s``.
"""

from kit.config.workload import WorkloadSpec, padded_vocab_size


def model_flops_per_step(workload: WorkloadSpec, global_batch_size: int, tp: int = 1) -> float:
    """Model FLOPs of one training step (forward and backward), Megatron-LM's definition.

    See the module docstring for the formula and its source. The count is independent of
    parallelism and activation recomputation except through the padded vocabulary (``tp``).

    Args:
        workload: Model architecture.
        global_batch_size: Samples (sequences of ``workload.seq_length``) per optimizer step.
        tp: Tensor-parallel degree, used only to pad the vocabulary.

    Returns:
        Floating-point operations per step.
    """
    if global_batch_size <= 0:
        raise ValueError("global_batch_size must be positive")
    w = workload
    h, s = w.hidden_size, w.seq_length
    head_dim = h // w.num_attention_heads
    q = head_dim * w.num_attention_heads
    kv = head_dim * w.query_groups
    ffn_expansion = 3 if w.activation == "swiglu" else 2
    routed = w.moe_top_k if w.is_moe else 1
    vocab = padded_vocab_size(w.vocab_size, tp)

    attention = h * (q + 2 * kv) + q * s + q * h
    mlp = ffn_expansion * h * w.ffn_hidden_size * routed
    per_token = w.num_layers * (attention + mlp) + h * vocab
    return float(3 * 2 * global_batch_size * s * per_token)


def params_count(workload: WorkloadSpec) -> int:
    """Total trainable parameters of the megatron-core GPT model, unpadded vocabulary.

    Counts the word embedding, learned position embedding (if any), per layer the two norms,
    QKV and output projections, the MLP (every expert plus the router for MoE) with biases
    when ``add_bias_linear``, the final norm, and a separate output layer when embeddings
    are untied. LayerNorm has a weight and a bias, RMSNorm a weight only.

    Args:
        workload: Model architecture.

    Returns:
        Number of parameters (experts counted in full, not only the active ones).
    """
    w = workload
    h, f = w.hidden_size, w.ffn_hidden_size
    head_dim = h // w.num_attention_heads
    q = head_dim * w.num_attention_heads
    kv = head_dim * w.query_groups
    bias = w.add_bias_linear
    norm = 2 * h if w.normalization == "layernorm" else h
    gate = 2 if w.activation == "swiglu" else 1

    attention = h * (q + 2 * kv) + q * h + ((q + 2 * kv + h) if bias else 0)
    expert = h * f * gate + f * h + ((f * gate + h) if bias else 0)
    mlp = w.num_experts * expert + h * w.num_experts if w.num_experts else expert
    layer = 2 * norm + attention + mlp

    embedding = w.vocab_size * h
    if w.position_embedding == "learned_absolute":
        embedding += w.seq_length * h
    output = 0 if w.tie_embeddings else w.vocab_size * h
    return w.num_layers * layer + embedding + norm + output
