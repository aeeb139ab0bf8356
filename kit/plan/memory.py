"""Per-device memory estimate of a resolved run, so impossible configs fail before any rank starts.

Every figure is bytes on one device (one rank process on ``cpu``) and follows what the kit's
megatron engine allocates; ``docs/memory.md`` derives each term and cites its source.

* Model state: parameters held by one rank of a pipeline stage (TP shards, PP stages, EP expert
  shards; embeddings on the first stage, final norm and output layer on the last) times bytes
  per parameter for weights, gradients and optimizer states (AdamW). Mixed precision on GPUs:
  bf16 weights, fp32 gradients (megatron's ``grad_reduce_in_fp32``; DeepSpeed keeps bf16), fp32
  master weights and two fp32 moments. ``cpu`` and fp32 runs: fp32 weights and gradients, two
  fp32 moments, no master copy. The distributed optimizer shards the optimizer states over DP x
  CP (experts over DP x CP / EP), FSDP and ZeRO-3 shard all three, ZeRO-1/2 the first one/two.
* Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
  Models", arXiv 2205.05198) counted per layer and micro-batch, adapted to the engine: SDPA
  flash attention (no ``s x s`` scores), no dropout (no masks), grouped-query K/V, RoPE copies,
  SwiGLU, MoE top-k token copies; times the micro-batches in flight under 1F1B (or the
  interleaved schedule) on that stage. Full recompute keeps each layer's input plus one layer
  being recomputed.
* Logits: the vocabulary-parallel cross entropy's fp32 softmax plus the bf16 logits it is cast
  from, on the last stage.
* A fixed framework overhead per device: the platform profile's ``rank_overhead_gib``.
"""

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, computed_field

from kit.config.run import RunConfig
from kit.config.workload import padded_vocab_size
from kit.engines import engine_spec
from kit.engines.registry import BytesPerParameter, Sharding

GIB = 1024**3

_ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class StageParameters:
    """Parameters one device of a pipeline stage holds."""

    dense: int
    """Replicated over DP x CP: attention, norms, router, embeddings, dense MLPs."""
    expert: int
    """MoE expert weights, replicated over DP x CP / EP only."""


class StageMemory(BaseModel):
    """Estimated bytes on one device of one pipeline stage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: int = Field(ge=0, description="Pipeline stage (0 holds the embeddings).")
    parameters: int = Field(ge=0, description="Parameters held by one device of the stage.")
    micro_batches_in_flight: int = Field(
        ge=1, description="Model chunks whose activations are held at the peak (1F1B warm-up)."
    )
    weights_bytes: int = Field(ge=0, description="Model weights (and whole copies an engine "
                               "keeps gathered through the step).")
    grads_bytes: int = Field(ge=0, description="Gradient buffers (and unsharded accumulators).")
    optimizer_bytes: int = Field(ge=0, description="fp32 master weights and AdamW moments.")
    activations_bytes: int = Field(ge=0, description="Activations saved for backward at the peak.")
    logits_bytes: int = Field(ge=0, description="Logits and cross-entropy buffers (last stage).")
    overhead_bytes: int = Field(ge=0, description="Framework overhead (context, allocator).")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total_bytes(self) -> int:
        """Everything the device must hold at the peak."""
        return self.allocated_bytes + self.overhead_bytes

    @computed_field  # type: ignore[prop-decorator]
    @property
    def allocated_bytes(self) -> int:
        """Tensor bytes only: the figure to compare with ``torch.cuda.max_memory_allocated``."""
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.logits_bytes)


class MemoryEstimate(BaseModel):
    """Per-stage estimates, the device capacity they must fit in, and the verdict."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stages: list[StageMemory] = Field(description="One entry per pipeline stage.")
    required_bytes: int = Field(
        description="What must fit in the capacity: the largest stage on a GPU; the sum over "
        "all rank processes on cpu, whose ranks share the host's memory."
    )
    capacity_bytes: int | None = Field(
        description="Memory per device from the platform profile; host RAM on cpu; null when "
        "the profile declares none."
    )
    capacity_source: str = Field(description="Where the capacity comes from, for messages.")
    shared_host: bool = Field(
        description="Whether the ranks are processes sharing one host's RAM (cpu platform)."
    )
    margin_bytes: int = Field(
        0, ge=0, description="Headroom a multi-rank run needs before it can be trusted to fit "
        "(the platform's multi_rank_margin_gib; 0 for one rank and on cpu): less warns, it "
        "does not refuse.")
    remedies: str = Field(
        "", description="How to need less memory, leaving out what the run already does "
        "(--recompute full, --dist-optimizer, micro-batch 1), for messages.")

    @property
    def peak(self) -> StageMemory:
        """The stage with the largest total (the device that runs out first)."""
        return max(self.stages, key=lambda s: s.total_bytes)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fits(self) -> bool | None:
        """Whether the requirement fits the capacity; null when the capacity is unknown."""
        return None if self.capacity_bytes is None else self.required_bytes <= self.capacity_bytes

    @computed_field  # type: ignore[prop-decorator]
    @property
    def headroom_bytes(self) -> int | None:
        """Capacity left over (negative when it does not fit)."""
        return None if self.capacity_bytes is None else self.capacity_bytes - self.required_bytes

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tight(self) -> bool:
        """Whether it fits with less headroom than multi-rank runs were seen to need."""
        return bool(self.fits) and (self.headroom_bytes or 0) < self.margin_bytes


def element_bytes(dtype: str) -> int:
    """Bytes of one activation element in the training dtype."""
    return _ELEMENT_BYTES[dtype]


def bytes_per_parameter(cfg: RunConfig) -> BytesPerParameter:
    """Weights, gradient and optimizer bytes per parameter for ``cfg``'s engine and dtype."""
    if cfg.platform.is_cpu or cfg.dtype == "fp32":
        return BytesPerParameter(weights=4, grads=4, optimizer=8)
    return engine_spec(cfg.engine).bytes_per_parameter(cfg)


def sharding(cfg: RunConfig, zero_stage: int | None = None) -> Sharding:
    """Which model-state parts ``cfg`` shards over data parallelism (the engine's choice).

    ``zero_stage`` overrides DeepSpeed's ZeRO stage; other engines ignore it.
    """
    return engine_spec(cfg.engine).sharding(cfg, zero_stage)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def layer_parameters(cfg: RunConfig) -> StageParameters:
    """Parameters of one transformer layer on one tensor-parallel rank.

    Column-parallel weights and biases (QKV, MLP fc1) and row-parallel weights (attention
    output, fc2) are split by TP; row-parallel biases, norms and the MoE router are replicated.
    Each rank holds ``experts / ep`` experts, each split by the expert TP size (megatron-core's
    default: equal to TP).
    """
    w, t = cfg.workload, cfg.parallel.tp
    h, f = w.hidden_size, w.ffn_hidden_size
    head_dim = h // w.num_attention_heads
    q, kv = head_dim * w.num_attention_heads, head_dim * w.query_groups
    bias = w.add_bias_linear
    norm = 2 * h if w.normalization == "layernorm" else h
    gate = 2 if w.activation == "swiglu" else 1

    attention = (h * (q + 2 * kv) + q * h) // t + ((q + 2 * kv) // t + h if bias else 0)
    mlp = _ceil_div(gate * h * f + f * h, t) + (_ceil_div(gate * f, t) + h if bias else 0)
    if w.num_experts is None:
        return StageParameters(dense=2 * norm + attention + mlp, expert=0)
    router = h * w.num_experts
    return StageParameters(
        dense=2 * norm + attention + router, expert=w.num_experts // cfg.parallel.ep * mlp
    )


def stage_parameters(cfg: RunConfig, stage: int) -> StageParameters:
    """Parameters one device of pipeline ``stage`` holds.

    Stage 0 adds the word embedding (padded vocabulary, split by TP) and a learned position
    embedding (replicated); the last stage adds the final norm and the output layer, which is a
    separate weight when embeddings are untied, and a copy of the tied embedding when PP > 1
    (megatron-core keeps both ends' copies in sync).
    """
    w, p = cfg.workload, cfg.parallel
    h = w.hidden_size
    layer = layer_parameters(cfg)
    layers = w.num_layers // p.pp
    dense, expert = layers * layer.dense, layers * layer.expert
    vocab_shard = padded_vocab_size(w.vocab_size, p.tp) * h // p.tp
    if stage == 0:
        dense += vocab_shard
        if w.position_embedding == "learned_absolute":
            dense += w.seq_length * h
    if stage == p.pp - 1:
        dense += 2 * h if w.normalization == "layernorm" else h
        if not w.tie_embeddings or p.pp > 1:
            dense += vocab_shard
    return StageParameters(dense=dense, expert=expert)


def micro_batches_in_flight(cfg: RunConfig, stage: int) -> int:
    """Model chunks whose activations ``stage`` holds at its peak, per megatron-core's schedules.

    Without PP one micro-batch runs forward then backward. 1F1B: stage ``r`` of ``p`` warms up
    with ``p - r - 1`` forwards and runs one more before its first backward, so ``min(p - r, m)``
    for ``m`` micro-batches. Interleaved (``v`` chunks per stage): ``(p - r - 1) * 2 +
    (v - 1) * p + 1`` chunks of ``L / (p v)`` layers, at most ``m v``; on stage 0 that is
    Korthikanti et al.'s ``L (1 + (p - 1) / (p v))`` layers' worth.
    """
    p, m = cfg.parallel, cfg.grad_accum_steps
    if p.pp == 1:
        return 1
    if not p.vpp or p.vpp == 1:
        return min(p.pp - stage, m)
    return min((p.pp - stage - 1) * 2 + (p.vpp - 1) * p.pp + 1, m * p.vpp)


def _tokens(cfg: RunConfig) -> int:
    """Tokens of one micro-batch on one context-parallel rank."""
    return cfg.micro_batch_size * cfg.workload.seq_length // cfg.parallel.cp


def norm_saved_elements(cfg: RunConfig) -> int:
    """Hidden-sized tensors one norm saves beyond the output its consumer saves.

    LayerNorm (torch's fused kernel everywhere) and RMSNorm on GPUs (torch's fused
    ``_fused_rms_norm``) save their input (plus per-token statistics); on ``cpu`` torch's
    RMSNorm is composite and also saves the normalized tensor before the weight.
    """
    composite = cfg.platform.is_cpu and cfg.workload.normalization == "rmsnorm"
    return 2 if composite else 1


def layer_activation_bytes(cfg: RunConfig) -> int:
    """Bytes one layer saves for backward for one micro-batch, without recomputation.

    Per token, with ``e`` bytes per element, ``t`` = TP, ``r`` = TP with SP else 1:
    ``4 e h / r`` (both norms' inputs and outputs, replicated over TP unless SP; 6 for
    composite RMSNorm, see :func:`norm_saved_elements`),
    ``e (h + 2 kv) / t`` (the fused QKV output, kept alive by the K/V views SDPA saves),
    ``e h / t`` (a separate query: RoPE output or the grouped-query reshape copy),
    ``e kv / t`` (RoPE key), ``e h / t`` (attention output, saved by SDPA and the output
    projection); MLP ``2 e f / t`` (GELU input and output) or ``5 e f / t`` (megatron-core's
    unfused SwiGLU: fc1 output of width 2f, SiLU output, the linear half plus its offset, the
    product); MoE instead ``k (e h + (c + 1) e f / t)`` with ``c`` the dense MLP's factor: each
    token's ``k`` routed copies as expert input, the expert MLP and the router-probability
    scaling of its output. RoPE adds its cos/sin tables for query and key, ``4 e s d`` per
    layer and micro-batch whatever the batch size. Context parallelism (``c`` = CP) adds the
    keys and values gathered from the other ranks, ``2 e kv (c - 1) / t`` per local token
    (:mod:`kit.engines.megatron.context_parallel`). The selective recompute of megatron-core
    (``core_attn``) drops nothing more: SDPA flash attention keeps no ``s x s`` scores, which
    is the ``5 a s / h`` term Korthikanti et al. recompute.
    """
    w, p = cfg.workload, cfg.parallel
    e, t = element_bytes(cfg.dtype), p.tp
    r = t if p.sp else 1
    h = w.hidden_size
    f_shard = _ceil_div(w.ffn_hidden_size, t)
    head_dim = h // w.num_attention_heads
    kv = head_dim * w.query_groups
    rope = w.position_embedding == "rope"
    gqa = w.query_groups != w.num_attention_heads
    mlp_factor = 5 if w.activation == "swiglu" else 2

    per_token = 2 * (norm_saved_elements(cfg) + 1) * e * h // r
    per_token += e * (h + 2 * kv) // t
    if rope or gqa:
        per_token += e * h // t
    if rope:
        per_token += e * kv // t
    per_token += e * h // t
    if w.num_experts is None:
        per_token += mlp_factor * e * f_shard
    else:
        per_token += w.moe_top_k * (e * h + (mlp_factor + 1) * e * f_shard)
    if p.cp > 1:  # SDPA keeps the keys and values gathered from the other CP ranks
        per_token += 2 * e * kv * (p.cp - 1) // t
    rope_tables = 4 * e * (w.seq_length // p.cp) * head_dim if rope else 0
    return per_token * _tokens(cfg) + rope_tables


def layer_input_bytes(cfg: RunConfig) -> int:
    """Bytes of one layer's input for one micro-batch: all full recompute keeps per layer."""
    r = cfg.parallel.tp if cfg.parallel.sp else 1
    return element_bytes(cfg.dtype) * cfg.workload.hidden_size // r * _tokens(cfg)


def activation_bytes(cfg: RunConfig, stage: int) -> int:
    """Activations ``stage`` holds at its peak: layers x micro-batches in flight, plus the head.

    Full recompute keeps each layer's input and rematerializes one layer at a time in backward.
    The last stage adds what the final norm saves and the output layer's input (``2 e h / r``
    per token, 3 with composite RMSNorm).
    """
    p = cfg.parallel
    layers_per_chunk = cfg.workload.num_layers // (p.pp * (p.vpp or 1))
    held = micro_batches_in_flight(cfg, stage) * layers_per_chunk
    if cfg.optim.recompute == "full":
        out = held * layer_input_bytes(cfg) + layer_activation_bytes(cfg)
    else:
        out = held * layer_activation_bytes(cfg)
    if stage == p.pp - 1:
        out += (norm_saved_elements(cfg) + 1) * layer_input_bytes(cfg)
    return out


def logits_bytes(cfg: RunConfig, stage: int) -> int:
    """Logits buffers on the last stage: ``(4 + e) s b V / t`` (``4 s b V / t`` in fp32).

    megatron-core's vocabulary-parallel cross entropy casts the logits to fp32 and keeps that
    softmax for backward; the cast's bf16 source is alive at the same time.
    """
    w, p = cfg.workload, cfg.parallel
    if stage != p.pp - 1:
        return 0
    e = element_bytes(cfg.dtype)
    per_element = 4 + (e if e != 4 else 0)
    return per_element * _tokens(cfg) * padded_vocab_size(w.vocab_size, p.tp) // p.tp


def _state_bytes(count: int, per_param: int, sharded: bool, group: int) -> int:
    return _ceil_div(count * per_param, group) if sharded else count * per_param


def stage_memory(cfg: RunConfig, stage: int, zero_stage: int | None = None) -> StageMemory:
    """The estimate for one device of pipeline ``stage``."""
    p = cfg.parallel
    params = stage_parameters(cfg, stage)
    per = bytes_per_parameter(cfg)
    shard = sharding(cfg, zero_stage)
    whole = engine_spec(cfg.engine).unsharded_bytes_per_parameter(cfg)
    dp_group = p.dp * p.cp
    expert_group = max(dp_group // p.ep, 1)

    def state(per_param: int, sharded: bool) -> int:
        return (_state_bytes(params.dense, per_param, sharded, dp_group)
                + _state_bytes(params.expert, per_param, sharded, expert_group))

    return StageMemory(
        stage=stage,
        parameters=params.dense + params.expert,
        micro_batches_in_flight=micro_batches_in_flight(cfg, stage),
        weights_bytes=state(per.weights, shard.weights) + state(whole.weights, False),
        grads_bytes=state(per.grads, shard.grads) + state(whole.grads, False),
        optimizer_bytes=state(per.optimizer, shard.optimizer),
        activations_bytes=activation_bytes(cfg, stage),
        logits_bytes=logits_bytes(cfg, stage),
        overhead_bytes=int(cfg.platform.rank_overhead_gib * GIB),
    )


def host_memory_bytes() -> int:
    """Total RAM of this host (what ``cpu`` ranks share)."""
    import psutil

    return int(psutil.virtual_memory().total)


def estimate_memory(cfg: RunConfig, zero_stage: int | None = None) -> MemoryEstimate:
    """Estimate per-device memory of ``cfg`` and whether it fits its platform.

    Args:
        cfg: A resolved run (:func:`kit.plan.resolve.resolve`).
        zero_stage: DeepSpeed ZeRO stage for the deepspeed engine; ``None`` takes the config's.

    Returns:
        One :class:`StageMemory` per pipeline stage, the requirement, the capacity (the
        platform's memory per device; this host's RAM, shared by every rank, on ``cpu``) and
        the verdict.
    """
    stages = [stage_memory(cfg, s, zero_stage) for s in range(cfg.parallel.pp)]
    plat = cfg.platform
    if plat.is_cpu:
        ranks_per_stage = cfg.world_size // cfg.parallel.pp
        required = sum(s.total_bytes for s in stages) * ranks_per_stage
        capacity: int | None = host_memory_bytes()
        source = f"host RAM shared by {cfg.world_size} rank process(es)"
    else:
        required = max(s.total_bytes for s in stages)
        gib = plat.memory_per_device_gib
        capacity = None if gib is None else int(gib * GIB)
        source = f"{plat.name} ({plat.device_name}) memory per device"
    multi_rank = cfg.world_size > 1 and not plat.is_cpu
    return MemoryEstimate(
        stages=stages, required_bytes=required, capacity_bytes=capacity, capacity_source=source,
        shared_host=plat.is_cpu,
        margin_bytes=int(plat.multi_rank_margin_gib * GIB) if multi_rank else 0,
        remedies=_remedies(cfg, plat.is_cpu),
    )


def _remedies(cfg: RunConfig, shared_host: bool) -> str:
    """What would need less memory, of what ``cfg`` does not do yet, in words."""
    smaller = ["a smaller --micro-batch"] if cfg.micro_batch_size > 1 else []
    if shared_host:
        ways = ["use a smaller workload", "fewer ranks", *smaller]
    else:
        shard = "--tp, --pp" + ("" if cfg.optim.dist_optimizer else ", --dist-optimizer")
        ways = [f"shard more ({shard})",
                *(["use --recompute full"] if cfg.optim.recompute != "full" else []), *smaller]
    return ways[0] if len(ways) == 1 else f"{', '.join(ways[:-1])} or {ways[-1]}"


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def fit_refusal(est: MemoryEstimate) -> str | None:
    """One line saying why ``est`` does not fit and how to fix it; ``None`` when it fits."""
    if est.fits is not False:
        return None
    s = est.peak
    assert est.capacity_bytes is not None
    parts = (f"weights {_gib(s.weights_bytes)}, grads {_gib(s.grads_bytes)}, optimizer "
             f"{_gib(s.optimizer_bytes)}, activations {_gib(s.activations_bytes)}, logits "
             f"{_gib(s.logits_bytes)}, overhead {_gib(s.overhead_bytes)}")
    where = "each rank" if est.shared_host else f"pipeline stage {s.stage}"
    return (
        f"predicted not to fit: estimated {_gib(est.required_bytes)} ({where}: {parts}) > "
        f"{_gib(est.capacity_bytes)} {est.capacity_source}; {est.remedies}, or pass --force "
        "to run anyway"
    )


def fit_warning(est: MemoryEstimate) -> str | None:
    """One line saying that ``est`` fits too tightly to trust, or ``None``.

    The refusal counts the platform's fixed overhead only. On 4 H100s, gpt3-175b-8l TP2 x PP2 x
    VPP2 was estimated at 72.1 GiB (7.9 GiB of headroom against the nominal 80) and ran out:
    8.2 GiB in use outside PyTorch's allocator (NCCL's buffers), 71.1 GiB of tensors, in a
    device of 79.2 GiB; the platform's ``multi_rank_margin_gib`` keeps that gap.
    """
    if not est.tight:
        return None
    assert est.headroom_bytes is not None
    return (f"memory may run out: {_gib(est.headroom_bytes)} of headroom, less than the "
            f"{_gib(est.margin_bytes)} that multi-rank runs on this platform were seen to need "
            f"beyond the estimate (communicator buffers); if it does, {est.remedies}")


def predicted_oom(cfg: RunConfig, zero_stage: int | None = None) -> str | None:
    """Why ``cfg`` is predicted to run out of memory, or ``None``: for sweeps to skip a point."""
    return fit_refusal(estimate_memory(cfg, zero_stage))


def estimate_vs_measured(
    cfg: RunConfig, measured_peak_bytes: int, stage: int | None = None
) -> dict[str, float]:
    """The estimate beside a measured peak, for benchmark scripts.

    On GPUs the measured figure is ``torch.cuda.max_memory_allocated()`` (what the engine
    reports), which sees tensors only, so it is compared with the estimate's
    ``allocated_bytes``; on ``cpu`` it is the rank process's peak resident set size, which
    includes the process itself, so it is compared with ``total_bytes``.

    Args:
        cfg: The run that was measured.
        measured_peak_bytes: One rank's peak (a bundle's ``per_rank`` ``mem_peak_bytes``).
        stage: That rank's pipeline stage; ``None`` = the stage with the largest estimate.

    Returns:
        ``estimate_gib``, ``measured_gib`` and ``error`` (estimate / measured - 1).
    """
    full = estimate_memory(cfg)
    s = full.peak if stage is None else full.stages[stage]
    est = s.total_bytes if cfg.platform.is_cpu else s.allocated_bytes
    return {
        "estimate_gib": est / GIB,
        "measured_gib": measured_peak_bytes / GIB,
        "error": est / measured_peak_bytes - 1,
    }
