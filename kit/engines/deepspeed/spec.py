"""What the deepspeed engine can run, and what it costs, known before any rank starts.

The engine is DeepSpeed's data parallelism (ZeRO 0-3, optionally with optimizer offload) and
its pipeline engine; layouts that need another engine's model parallelism are refused here
with a one-line reason instead of failing inside DeepSpeed.
"""

from kit.config.run import ParallelConfig, RunConfig
from kit.engines.registry import BytesPerParameter, EngineSpec, Sharding

SPEED_FEATURES = ("compile", "cross_entropy")
"""GPU speed features of the deepspeed engine (kit.engines.deepspeed.speed)."""

_OFFLOAD = ("--offload moves ZeRO's optimizer states to the host; use it with --engine "
            "deepspeed and --zero 1, 2 or 3")


class DeepSpeedSpec(EngineSpec):
    """DeepSpeed: ZeRO stages 0-3 with optional offload, and its pipeline engine."""

    name = "deepspeed"
    engine_class = "kit.engines.deepspeed.engine:DeepSpeedEngine"
    speed_features = SPEED_FEATURES
    requires = {"deepspeed": "./run.sh installs it, or run DS_BUILD_OPS=0 pip install "
                             "--no-build-isolation -e '.[deepspeed]'"}
    packages = ("deepspeed",)
    options = {
        "zero": "--zero is a DeepSpeed stage; use --engine deepspeed or --dist-optimizer",
        "offload": _OFFLOAD,
    }

    def violations(self, cfg: RunConfig) -> list[str]:
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
            out.append(f"DeepSpeed's pipeline engine supports ZeRO stage 0 or 1, not "
                       f"--zero {o.zero} with --pp > 1")
        if p.pp > 1 and cfg.workload.is_moe:
            out.append("mixture-of-experts workloads under DeepSpeed's pipeline engine are not "
                       "supported; use --pp 1 or --engine megatron")
        if o.offload and o.zero == 0:
            out.append(_OFFLOAD)
        if cfg.workload.is_moe and o.zero == 3:
            out.append("DeepSpeed's MoE layer does not support ZeRO stage 3; use --zero 1 or 2")
        if o.recompute == "selective":
            out.append("--recompute selective is megatron's (attention core only); the deepspeed "
                       "engine recomputes whole layers: use --recompute full")
        out.extend(self.unknown_speed(cfg))
        if o.overlap and o.zero == 0:
            out.append("--overlap with --engine deepspeed overlaps ZeRO's reduce and gather with "
                       "compute; use it with --zero 1, 2 or 3")
        return out

    def bytes_per_parameter(self, cfg: RunConfig) -> BytesPerParameter:
        # ZeRO paper (Rajbhandari et al. 2020): 2 + 2 + K=12
        return BytesPerParameter(weights=2, grads=2, optimizer=12)

    def sharding(self, cfg: RunConfig, zero_stage: int | None = None) -> Sharding:
        stage = cfg.optim.zero if zero_stage is None else zero_stage
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0-3, got {stage}")
        return Sharding(weights=stage >= 3, grads=stage >= 2, optimizer=stage >= 1)

    def placement(self, parallel: ParallelConfig, rank: int) -> dict[str, int]:
        """``PipeDataParallelTopology`` (axes pipe, data; data fastest); without a pipeline
        every rank is a data-parallel rank."""
        return {"tp_rank": 0, "cp_rank": 0, "dp_rank": rank % parallel.dp,
                "pp_rank": rank // parallel.dp, "ep_rank": 0}

    def options_summary(self, cfg: RunConfig) -> str:
        return f"zero={cfg.optim.zero} offload={cfg.optim.offload}"
