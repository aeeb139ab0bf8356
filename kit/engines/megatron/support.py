"""What the megatron engine can run where, checked before any rank starts."""

from kit.engines.megatron import adapter
from kit.spec.run import RunConfig


def megatron_violations(cfg: RunConfig) -> list[str]:
    """Return why the megatron engine cannot run ``cfg`` here (empty when it can)."""
    out: list[str] = []
    p, o = cfg.parallel, cfg.optim
    if cfg.workload.is_moe and p.tp > 1 and not p.sp:
        out.append("a mixture-of-experts workload with --tp > 1 needs --sp: megatron-core "
                   "requires sequence parallelism for MoE layers under tensor parallelism")
    if cfg.launcher != "local":
        out.append("--launcher slurm is not available yet; run one node with --launcher local")
    if o.fsdp:
        out.extend(_megatron_fsdp_violations(cfg))
    return out


def _megatron_fsdp_violations(cfg: RunConfig) -> list[str]:
    """Layouts megatron-core's Megatron-FSDP (``--fsdp``) cannot train correctly."""
    p = cfg.parallel
    out: list[str] = []
    if p.pp > 1:
        out.append("--fsdp needs --pp 1: megatron-core's Megatron-FSDP lays its device mesh "
                   "over all ranks as data x tensor parallel, with no pipeline dimension")
    groups = {"data-parallel": p.dp}
    if cfg.workload.is_moe:
        groups["expert data-parallel"] = p.dp * p.cp // p.ep
    for name, size in groups.items():
        flaw = adapter.megatron_fsdp_one_rank_group_flaw(p.dp) if size == 1 else None
        if flaw:
            out.append(f"--fsdp over {name} groups of one rank trains wrongly: {flaw}; "
                       "raise --dp (or lower --ep) so each group has 2 or more ranks")
    return out
