"""Every collective one rank of a pipeline stage issues, with its size, from the layout alone.

Sizes are nccl-tests' ``S`` (docs/fabric.md), so each one's time can be read off a measured
bus-bandwidth curve: all-reduce the buffer, all-gather the gathered output, reduce-scatter the
full input, all-to-all one rank's send buffer, send/recv what one rank sends. Symbols: ``b``
micro-batch, ``s`` sequence, ``h`` hidden size, ``a`` bytes per activation element (the run's
dtype), ``t, c, e, d, p, v`` the TP, CP, EP, DP, PP and virtual-stage degrees, ``k`` the MoE
top-k, ``g_r`` key/value heads per TP rank and ``d_h`` the head size. What megatron-core
0.16-0.19 issues, read from its source (tensor_parallel/layers.py, mappings.py,
moe/token_dispatcher.py, pipeline_parallel/schedules.py, distributed/) and the kit's engine:

Per transformer layer and micro-batch (``calls`` below are per layer; the stage holds ``L/p``):

* TP without SP: 2 all-reduces forward (attention output, MLP output), 2 backward (the
  column-parallel inputs' gradients), each ``S = b (s/c) h a``.
* TP with SP: a column-parallel linear all-gathers its input forward and again in backward
  (for the weight gradient) and reduce-scatters its input gradient; a row-parallel one
  reduce-scatters its output forward and all-gathers the output gradient. A dense layer has
  two of each: forward 2 all-gathers + 2 reduce-scatters, backward 4 + 2, ``S = b (s/c) h a``.
  A MoE layer has this for attention only.
* MoE (all-to-all dispatcher, expert TP = t): forward an all-to-all of the ``b s/(c t) k``
  routed tokens over EP (``S = b s/(c t) k h a``), an all-gather of what arrived over TP
  (``S = t`` times that), the experts, a reduce-scatter back and the combining all-to-all;
  backward the same four.
* CP (the kit's all-gather attention, kit/engines/megatron/context_parallel.py): keys and
  values are all-gathered forward (2 all-gathers, ``S = b s g_r d_h a``) and their gradients
  reduce-scattered backward (2).
* Full recompute runs each layer's forward again in backward: its forward collectives twice.

Per stage and micro-batch:

* TP at the ends: the vocabulary-parallel embedding's output (stage 0: all-reduce, or with SP a
  reduce-scatter forward and an all-gather backward) and the output layer (last stage: with SP
  an all-gather forward and an all-gather and a reduce-scatter backward; without SP an
  all-reduce backward), ``S = b (s/c) h a``; the vocabulary-parallel cross-entropy's three fp32
  all-reduces of ``b (s/c)`` values (maximum, target logit, sum of exponentials).
* PP: the activation forward and its gradient backward, ``S = b (s/c) h a`` (``/t`` with SP,
  megatron's p2p tensor shape), as exchanges where a rank sends and receives at once: 1 per
  micro-batch on an end stage, 2 on an inner one, ``2 v`` with ``v`` virtual stages.

Per stage and step:

* DP gradient reduction of the stage's parameters over DP x CP (experts' over their
  expert-data-parallel group, ``d c / e``), in fp32 (the kit's ``grad_reduce_in_fp32``): one
  all-reduce per bucket, or with the distributed optimizer a reduce-scatter per bucket and an
  all-gather of the updated bf16 parameters. One bucket holds everything unless ``--overlap``
  (then :data:`kit.engines.megatron.spec.GRAD_BUCKET_ELEMENTS` per bucket).
* Tied embeddings with ``p > 1``: the embedding gradient all-reduced between the first and
  last stage. SP: the replicated norm weights' (and row-parallel biases') gradients all-reduced
  over TP.

Small per-layer exchanges (MoE token counts and routing probabilities, the loss) are left out.
"""

import math
from dataclasses import dataclass
from typing import Literal

from kit.config.fabric import CollectiveOp
from kit.config.run import RunConfig
from kit.config.workload import WorkloadSpec, padded_vocab_size
from kit.engines.megatron.spec import GRAD_BUCKET_ELEMENTS
from kit.engines.registry import engine_spec
from kit.plan.memory import element_bytes, stage_parameters

Group = Literal["tp", "cp", "ep", "dp", "expert_dp", "pp", "embedding"]
"""Which ranks a collective runs among (kit.projection.network places each group on nodes)."""
Scope = Literal["micro_batch", "step"]
Overlap = Literal["none", "dp_grad", "dp_param"]
"""What a collective can hide behind: nothing (blocking in the critical path, as every TP, SP,
CP, EP and PP exchange is in megatron-core's local spec), the last micro-batch's backward
(``--overlap`` gradient reduction) or the first micro-batch's forward (``--overlap`` with the
distributed optimizer: parameter all-gather)."""
FP32_BYTES = 4


@dataclass(frozen=True)
class Collective:
    """One kind of collective one rank of a stage issues."""

    what: str
    """What it carries, for people (e.g. ``SP all-gather``)."""
    op: CollectiveOp
    group: Group
    size_bytes: int
    """nccl-tests' S (module docstring)."""
    calls: int
    """How many per micro-batch (scope ``micro_batch``) or per step (scope ``step``)."""
    scope: Scope
    overlap: Overlap = "none"


def _micro_tokens(cfg: RunConfig) -> int:
    """Tokens of one micro-batch on one context-parallel rank: ``b s / c``."""
    return cfg.micro_batch_size * cfg.workload.seq_length // cfg.parallel.cp


def layers_per_stage(cfg: RunConfig) -> int:
    """Transformer layers one pipeline stage holds (megatron's even split)."""
    return cfg.workload.num_layers // cfg.parallel.pp


def _tp_layer(cfg: RunConfig, blocks: int, fwd_times: int) -> list[Collective]:
    """TP/SP collectives of ``blocks`` linear pairs (attention, dense MLP) in one layer."""
    p = cfg.parallel
    if p.tp == 1 or blocks == 0:
        return []
    size = _micro_tokens(cfg) * cfg.workload.hidden_size * element_bytes(cfg.dtype)
    if not p.sp:
        return [Collective("TP all-reduce", "all_reduce", "tp", size,
                           blocks * (fwd_times + 1), "micro_batch")]
    return [Collective("SP all-gather", "all_gather", "tp", size,
                       blocks * (fwd_times + 2), "micro_batch"),
            Collective("SP reduce-scatter", "reduce_scatter", "tp", size,
                       blocks * (fwd_times + 1), "micro_batch")]


def _moe_layer(cfg: RunConfig, fwd_times: int) -> list[Collective]:
    """The all-to-all dispatcher's collectives in one MoE layer."""
    p, w = cfg.parallel, cfg.workload
    routed = _micro_tokens(cfg) // p.tp * w.moe_top_k * w.hidden_size * element_bytes(cfg.dtype)
    calls = 2 * (fwd_times + 1)  # dispatch and combine, forward (again when recomputed), backward
    out = []
    if p.ep > 1:
        out.append(Collective("MoE all-to-all", "all_to_all", "ep", routed, calls, "micro_batch"))
    if p.tp > 1:
        out += [Collective("MoE expert-TP all-gather", "all_gather", "tp", routed * p.tp,
                           calls // 2, "micro_batch"),
                Collective("MoE expert-TP reduce-scatter", "reduce_scatter", "tp",
                           routed * p.tp, calls // 2, "micro_batch")]
    return out


def _cp_layer(cfg: RunConfig, fwd_times: int) -> list[Collective]:
    """The kit's all-gather context parallelism in one layer: keys and values."""
    p, w = cfg.parallel, cfg.workload
    if p.cp == 1:
        return []
    head_dim = w.hidden_size // w.num_attention_heads
    kv_heads = max(1, w.query_groups // p.tp)
    size = cfg.micro_batch_size * w.seq_length * kv_heads * head_dim * element_bytes(cfg.dtype)
    return [Collective("CP key/value all-gather", "all_gather", "cp", size, 2 * fwd_times,
                       "micro_batch"),
            Collective("CP key/value gradient reduce-scatter", "reduce_scatter", "cp", size, 2,
                       "micro_batch")]


def layer_collectives(cfg: RunConfig) -> list[Collective]:
    """Collectives of one transformer layer per micro-batch (calls per layer)."""
    fwd_times = 2 if cfg.optim.recompute == "full" else 1
    moe = cfg.workload.is_moe
    return [*_tp_layer(cfg, 1 if moe else 2, fwd_times),
            *(_moe_layer(cfg, fwd_times) if moe else []),
            *_cp_layer(cfg, fwd_times)]


def _ends(cfg: RunConfig, stage: int) -> list[Collective]:
    """TP collectives of the embedding (stage 0) and output layer and loss (last stage)."""
    p = cfg.parallel
    if p.tp == 1:
        return []
    size = _micro_tokens(cfg) * cfg.workload.hidden_size * element_bytes(cfg.dtype)
    out = []
    if stage == 0:
        out += ([Collective("embedding reduce-scatter", "reduce_scatter", "tp", size, 1,
                            "micro_batch"),
                 Collective("embedding gradient all-gather", "all_gather", "tp", size, 1,
                            "micro_batch")] if p.sp else
                [Collective("embedding all-reduce", "all_reduce", "tp", size, 1, "micro_batch")])
    if stage == p.pp - 1:
        out += ([Collective("output layer all-gather", "all_gather", "tp", size, 2,
                            "micro_batch"),
                 Collective("output layer reduce-scatter", "reduce_scatter", "tp", size, 1,
                            "micro_batch")] if p.sp else
                [Collective("output layer all-reduce", "all_reduce", "tp", size, 1,
                            "micro_batch")])
        out += [Collective("cross-entropy maximum all-reduce", "all_reduce", "tp",
                           _micro_tokens(cfg) * FP32_BYTES, 1, "micro_batch"),
                Collective("cross-entropy sums all-reduce", "all_reduce", "tp",
                           2 * _micro_tokens(cfg) * FP32_BYTES, 1, "micro_batch")]
    return out


def _pipeline(cfg: RunConfig, stage: int) -> list[Collective]:
    """Activation and gradient exchanges of one stage per micro-batch."""
    p = cfg.parallel
    if p.pp == 1:
        return []
    size = (_micro_tokens(cfg) // (p.tp if p.sp else 1) * cfg.workload.hidden_size
            * element_bytes(cfg.dtype))
    v = p.vpp or 1
    calls = 2 * v if v > 1 else (1 if stage in (0, p.pp - 1) else 2)
    return [Collective("PP activation/gradient exchange", "send_recv", "pp", size, calls,
                       "micro_batch")]


def _buckets(what: str, group: Group, params: int, cfg: RunConfig) -> list[Collective]:
    """DP reduction of ``params`` gradients (and the parameter all-gather of the distributed
    optimizer), bucketed as megatron-core's DDP does for this run."""
    if params == 0:
        return []
    o = cfg.optim
    per_bucket = min(params, GRAD_BUCKET_ELEMENTS) if o.overlap else params
    buckets = math.ceil(params / per_bucket)
    grad_bytes = engine_spec(cfg.engine).bytes_per_parameter(cfg).grads
    if not o.dist_optimizer:
        return [Collective(f"{what} gradient all-reduce", "all_reduce", group,
                           per_bucket * grad_bytes, buckets, "step", "dp_grad")]
    weight_bytes = engine_spec(cfg.engine).bytes_per_parameter(cfg).weights
    return [Collective(f"{what} gradient reduce-scatter", "reduce_scatter", group,
                       per_bucket * grad_bytes, buckets, "step", "dp_grad"),
            Collective(f"{what} parameter all-gather", "all_gather", group,
                       per_bucket * weight_bytes, buckets, "step", "dp_param")]


def _norm_params(w: WorkloadSpec) -> int:
    """Parameters of one layer that SP keeps replicated over TP: norms, row-parallel biases."""
    norm = 2 * w.hidden_size if w.normalization == "layernorm" else w.hidden_size
    return 2 * norm + (2 * w.hidden_size if w.add_bias_linear else 0)


def _step(cfg: RunConfig, stage: int) -> list[Collective]:
    """Per-step reductions of one stage: DP (dense, experts), tied embeddings, SP norms."""
    p, w = cfg.parallel, cfg.workload
    params = stage_parameters(cfg, stage)
    out = []
    if p.dp * p.cp > 1:
        out += _buckets("DP", "dp", params.dense, cfg)
    if p.dp * p.cp // p.ep > 1:
        out += _buckets("expert DP", "expert_dp", params.expert, cfg)
    if w.tie_embeddings and p.pp > 1 and stage in (0, p.pp - 1):
        size = padded_vocab_size(w.vocab_size, p.tp) * w.hidden_size // p.tp * FP32_BYTES
        out.append(Collective("tied embedding gradient all-reduce", "all_reduce", "embedding",
                              size, 1, "step"))
    if p.tp > 1 and p.sp:
        out.append(Collective("SP norm gradient all-reduce", "all_reduce", "tp",
                              _norm_params(w) * layers_per_stage(cfg) * FP32_BYTES, 1, "step"))
    return out


def stage_collectives(cfg: RunConfig, stage: int) -> list[Collective]:
    """Every collective one rank of pipeline ``stage`` issues (module docstring).

    Layer collectives are multiplied out over the stage's layers, so ``calls`` is per
    micro-batch (or per step) for the whole stage.
    """
    layers = layers_per_stage(cfg)
    per_layer = [Collective(c.what, c.op, c.group, c.size_bytes, c.calls * layers, c.scope,
                            c.overlap) for c in layer_collectives(cfg)]
    return [*per_layer, *_ends(cfg, stage), *_pipeline(cfg, stage), *_step(cfg, stage)]
