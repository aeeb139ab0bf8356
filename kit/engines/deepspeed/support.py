"""What the deepspeed engine can run, checked before any rank starts.

The engine is DeepSpeed's data parallelism (ZeRO 0-3, optionally with optimizer offload) and
its pipeline engine; layouts that need another engine's model parallelism are refused here
with a one-line reason instead of failing inside DeepSpeed.
"""

from kit.spec.run import RunConfig


def deepspeed_violations(cfg: RunConfig) -> list[str]:
    """Return why the deepspeed engine cannot run ``cfg`` (empty when it can)."""
    p, o = cfg.parallel, cfg.optim
    out: list[str] = []
    if p.tp > 1:
        out.append("the deepspeed engine has no tensor parallelism (--tp > 1); "
                   "use --engine megatron")
    if p.sp:
        out.append("--sp is megatron's sequence parallelism; use --engine megatron")
    if p.cp > 1:
        out.append("the deepspeed engine has no context parallelism (--cp > 1); "
                   "use --engine megatron")
    if p.ep > 1:
        out.append("the deepspeed engine keeps every expert on each rank (--ep 1); "
                   "for expert parallelism use --engine megatron")
    if p.vpp is not None:
        out.append("DeepSpeed's pipeline engine has no virtual stages (--vpp); "
                   "use --engine megatron")
    if p.pp > 1 and o.zero > 1:
        out.append(f"DeepSpeed's pipeline engine supports ZeRO stage 0 or 1, not --zero {o.zero} "
                   "with --pp > 1")
    if p.pp > 1 and cfg.workload.is_moe:
        out.append("mixture-of-experts workloads under DeepSpeed's pipeline engine are not "
                   "supported; use --pp 1 or --engine megatron")
    if cfg.workload.is_moe and o.zero == 3:
        out.append("DeepSpeed's MoE layer does not support ZeRO stage 3; use --zero 1 or 2")
    if o.dist_optimizer:
        out.append("--dist-optimizer is megatron's; with --engine deepspeed use --zero 1")
    if o.fsdp:
        out.append("--fsdp is megatron's; with --engine deepspeed use --zero 3")
    if o.recompute == "selective":
        out.append("--recompute selective is megatron's (attention core only); the deepspeed "
                   "engine recomputes whole layers: use --recompute full")
    if o.overlap and o.zero == 0:
        out.append("--overlap with --engine deepspeed overlaps ZeRO's reduce and gather with "
                   "compute; use it with --zero 1, 2 or 3")
    if cfg.launcher != "local":
        out.append("--launcher slurm is not available yet; run one node with --launcher local")
    return out
