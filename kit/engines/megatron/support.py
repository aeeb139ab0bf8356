"""What the megatron engine can run where, checked before any rank starts."""

from kit.spec.run import RunConfig


def megatron_violations(cfg: RunConfig) -> list[str]:
    """Return why the megatron engine cannot run ``cfg`` here (empty when it can)."""
    out: list[str] = []
    p, o = cfg.parallel, cfg.optim
    if p.cp > 1:
        out.append("context parallelism (--cp > 1) needs attention that exchanges key/value "
                   "chunks between ranks, which megatron-core has only in Transformer Engine "
                   "(CUDA), not in the kit's SDPA attention; it is not supported yet")
    if cfg.workload.is_moe and p.tp > 1 and not p.sp:
        out.append("a mixture-of-experts workload with --tp > 1 needs --sp: megatron-core "
                   "requires sequence parallelism for MoE layers under tensor parallelism")
    if cfg.launcher != "local":
        out.append("--launcher slurm is not available yet; run one node with --launcher local")
    if o.fsdp:
        out.append("--fsdp cannot run on the cpu platform: megatron-core's FSDP builds its "
                   "DTensor device meshes with device_type='cuda'; use --dist-optimizer"
                   if cfg.platform.is_cpu else
                   "--fsdp is not wired into the megatron engine yet (it would train with plain "
                   "DDP); use --dist-optimizer")
    return out
