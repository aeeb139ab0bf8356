"""What the megatron engine can run where, checked before any rank starts."""

from kit.spec.run import RunConfig

# Parts of megatron-core 0.16 that allocate on "cuda" or need Transformer Engine, so the kit
# does not yet offer them on a CPU platform (see docs/engines.md).
_CPU_UNSUPPORTED = {
    "pp": "pipeline parallelism (--pp > 1) on the cpu platform is not supported yet: "
    "megatron-core's pipeline schedules allocate on cuda",
    "cp": "context parallelism (--cp > 1) needs Transformer Engine attention and a GPU",
    "ep": "expert parallelism (--ep > 1) on the cpu platform is not supported yet: "
    "the MoE token dispatchers use CUDA streams",
    "sp": "sequence parallelism on the cpu platform is not supported yet: megatron-core "
    "refuses it with torch LayerNorm",
    "dist_optimizer": "--dist-optimizer on the cpu platform is not supported yet: megatron's "
    "grad buffers are allocated on cuda",
    "fsdp": "--fsdp on the cpu platform is not supported yet",
    "overlap": "--overlap on the cpu platform is not supported yet: it needs megatron's DDP, "
    "whose buffers are allocated on cuda",
    "recompute": "--recompute on the cpu platform is not supported yet: megatron's checkpointing "
    "forks the CUDA RNG tracker",
}


def megatron_violations(cfg: RunConfig) -> list[str]:
    """Return why the megatron engine cannot run ``cfg`` here (empty when it can)."""
    out: list[str] = []
    p, o = cfg.parallel, cfg.optim
    if p.cp > 1:
        out.append(_CPU_UNSUPPORTED["cp"] if cfg.platform.is_cpu else
                   "context parallelism (--cp > 1) needs Transformer Engine, which this kit "
                   "does not require; it is not supported yet")
    if cfg.workload.is_moe and p.tp > 1 and not p.sp:
        out.append("a mixture-of-experts workload with --tp > 1 needs --sp: megatron-core "
                   "requires sequence parallelism for MoE layers under tensor parallelism")
    if cfg.launcher != "local":
        out.append("--launcher slurm is not available yet; run one node with --launcher local")
    if not cfg.platform.is_cpu:
        return out
    if p.pp > 1:
        out.append(_CPU_UNSUPPORTED["pp"])
    if p.ep > 1:
        out.append(_CPU_UNSUPPORTED["ep"])
    if p.sp:
        out.append(_CPU_UNSUPPORTED["sp"])
    if o.dist_optimizer:
        out.append(_CPU_UNSUPPORTED["dist_optimizer"])
    if o.fsdp:
        out.append(_CPU_UNSUPPORTED["fsdp"])
    if o.overlap:
        out.append(_CPU_UNSUPPORTED["overlap"])
    if o.recompute != "none":
        out.append(_CPU_UNSUPPORTED["recompute"])
    return out
