"""What the fsdp2 engine can run, and what it costs, known before any rank starts.

The engine is PyTorch's own fully sharded data parallelism (FSDP2, ``fully_shard``) over the
kit's plain PyTorch model, the one the deepspeed engine trains. It has data parallelism only;
layouts that need model parallelism are refused here with a one-line reason.
"""

from kit.config.run import ParallelConfig, RunConfig
from kit.engines.registry import BytesPerParameter, EngineSpec, Sharding
from kit.metrics.flops import params_count

SPEED_FEATURES = ("compile", "cross_entropy")
"""GPU speed features of the fsdp2 engine: ``torch.compile`` of every transformer block before
it is sharded (off by default: measured no faster), and the kit's fused cross-entropy (as in
the deepspeed engine)."""

UNSHARDED_MEMORY_FRAC = 0.4
"""Largest share of a device's memory the whole model's unsharded fp32 gradients and gathered
16-bit weights (6 bytes a parameter) may take for a step to accumulate them unsharded."""


def accumulates_unsharded(cfg: RunConfig) -> bool:
    """Whether a step's micro-batches accumulate gradients unsharded and keep weights gathered
    (one all-gather and one reduce-scatter a step instead of two and one a micro-batch).

    That holds the whole model's fp32 gradients and 16-bit weights on every rank through the
    step, so only where they take at most :data:`UNSHARDED_MEMORY_FRAC` of a device
    (gpt3-1.3b: 7.9 GB; gpt3-175b-4l: 47 GB, which fit an H200 and not an H100), or on the CPU.
    Per micro-batch, gpt3-175b-4l DP2 on 2 H200s spent 0.75 s of a 2.15 s step in element-wise
    kernels (casts and copies around the 16 gathers and reduce-scatters) against 0.37 s under
    Megatron-FSDP.
    """
    if cfg.platform.is_cpu:
        return True
    memory = cfg.platform.memory_per_device_gib
    return memory is not None and (
        6 * params_count(cfg.workload) <= UNSHARDED_MEMORY_FRAC * memory * 2**30)


_MODEL_PARALLEL = "the fsdp2 engine is data parallel only (PyTorch FSDP2); use --engine megatron"


class FSDP2Spec(EngineSpec):
    """PyTorch FSDP2: weights, gradients and AdamW states sharded over the data-parallel ranks,
    one all-gather and one reduce-scatter per transformer block."""

    name = "fsdp2"
    engine_class = "kit.engines.fsdp2.engine:FSDP2Engine"
    speed_features = SPEED_FEATURES
    packages = ("torch",)

    def violations(self, cfg: RunConfig) -> list[str]:
        p, o = cfg.parallel, cfg.optim
        out = [f"{flag} > 1: {_MODEL_PARALLEL}" for flag, degree in (
            ("--tp", p.tp), ("--pp", p.pp), ("--cp", p.cp), ("--ep", p.ep)) if degree > 1]
        if p.sp:
            out.append(f"--sp: {_MODEL_PARALLEL}")
        if cfg.workload.is_moe:
            out.append("mixture-of-experts workloads are not supported by the fsdp2 engine; "
                       "use --engine megatron or --engine deepspeed")
        if o.recompute == "selective":
            out.append("--recompute selective is megatron's (attention core only); the fsdp2 "
                       "engine recomputes whole layers: use --recompute full")
        if o.overlap:
            out.append("--overlap: FSDP2 always overlaps its all-gathers and reduce-scatters "
                       "with compute; drop --overlap with --engine fsdp2")
        out.extend(self.unknown_speed(cfg))
        return out

    def bytes_per_parameter(self, cfg: RunConfig) -> BytesPerParameter:
        # fp32 sharded parameters (FSDP2 gathers them in the training dtype for compute; the
        # fp32 shard is the master copy), fp32 gradients, AdamW's two fp32 moments
        return BytesPerParameter(weights=4, grads=4, optimizer=8)

    def sharding(self, cfg: RunConfig, zero_stage: int | None = None) -> Sharding:
        return Sharding(weights=True, grads=True, optimizer=True)

    def unsharded_bytes_per_parameter(self, cfg: RunConfig) -> BytesPerParameter:
        """Where a step accumulates unsharded: the gathered weights in the compute dtype and
        the fp32 gradients (fp32 weights on an fp32 run)."""
        if not accumulates_unsharded(cfg):
            return BytesPerParameter(weights=0, grads=0, optimizer=0)
        return BytesPerParameter(weights=4 if cfg.dtype == "fp32" else 2, grads=4, optimizer=0)

    def placement(self, parallel: ParallelConfig, rank: int) -> dict[str, int]:
        """Every rank is a data-parallel rank."""
        return {"tp_rank": 0, "cp_rank": 0, "dp_rank": rank, "pp_rank": 0, "ep_rank": 0}
