"""Layout rules with megatron-core's semantics, each violation one line that says how to fix it."""

from kit.config.run import RunConfig


def layout_violations(cfg: RunConfig) -> list[str]:
    """Return every rule ``cfg`` breaks, independent of engine and hardware."""
    w, p, o = cfg.workload, cfg.parallel, cfg.optim
    out: list[str] = []
    if w.num_attention_heads % p.tp:
        out.append(f"attention heads ({w.num_attention_heads}) must be divisible by --tp {p.tp}")
    if w.query_groups % p.tp:
        out.append(f"query groups ({w.query_groups}) must be divisible by --tp {p.tp}")
    if w.num_layers % p.pp:
        out.append(f"layers ({w.num_layers}) must be divisible by --pp {p.pp}")
    if o.recompute_method == "block" and o.recompute != "full":
        out.append("--recompute-method block chooses which layers full recompute checkpoints; "
                   "use it with --recompute full")
    if p.vpp is not None:
        if p.pp < 2:
            out.append("--vpp needs --pp of at least 2")
        elif w.num_layers % (p.pp * p.vpp):
            out.append(
                f"layers ({w.num_layers}) must be divisible by --pp x --vpp ({p.pp * p.vpp})"
            )
    if p.sp and p.tp < 2:
        out.append("--sp (sequence parallel) needs --tp of at least 2")
    if p.cp > 1 and w.seq_length % (2 * p.cp):
        out.append(f"sequence length ({w.seq_length}) must be divisible by 2 x --cp ({2 * p.cp})")
    if p.ep > 1 and not w.is_moe:
        out.append(f"--ep {p.ep} needs a mixture-of-experts workload; {w.name} is dense")
    if w.is_moe and p.ep > 1:
        assert w.num_experts is not None
        if w.num_experts % p.ep:
            out.append(f"experts ({w.num_experts}) must be divisible by --ep {p.ep}")
        if (p.dp * p.cp) % p.ep:
            out.append(
                f"--ep {p.ep} must divide dp x cp ({p.dp * p.cp}): experts are sharded inside "
                "the data-parallel group"
            )
    if cfg.global_batch_size % (cfg.micro_batch_size * p.dp):
        out.append(
            f"global batch ({cfg.global_batch_size}) must be divisible by micro-batch x dp "
            f"({cfg.micro_batch_size} x {p.dp})"
        )
    if cfg.warmup >= cfg.total_steps:
        out.append("--steps must be at least 1")
    return out
