"""What the megatron engine can run where, and what it costs, known before any rank starts."""

import importlib
from typing import TYPE_CHECKING

from kit.config.run import ParallelConfig, RunConfig
from kit.engines.execution import Execution
from kit.engines.megatron import adapter, features
from kit.engines.megatron.features import SPEED_FEATURES
from kit.engines.registry import BytesPerParameter, EngineSpec, Sharding

if TYPE_CHECKING:
    from kit.engines.base import Engine

GRAD_BUCKET_ELEMENTS = 40_000_000
"""Gradient elements per DDP bucket under ``--overlap`` (megatron-core's default size); without
overlap the whole gradient buffer is one bucket."""


class MegatronSpec(EngineSpec):
    """megatron-core: TP, PP (with virtual stages), CP, EP, SP, its DDP, distributed optimizer
    and Megatron-FSDP. A dependency of the kit itself, so nothing extra to install."""

    name = "megatron"
    engine_class = "kit.engines.megatron.engine:MegatronEngine"
    speed_features = SPEED_FEATURES
    packages = ("megatron-core", "transformer-engine")
    options = {
        "dist_optimizer": "--dist-optimizer is megatron's; with --engine deepspeed use --zero 1",
        "fsdp": "--fsdp is megatron's (Megatron-FSDP); PyTorch's FSDP2 is --engine fsdp2, "
                "DeepSpeed's full sharding --engine deepspeed --zero 3",
        "eager": "--eager keeps the megatron engine's step out of a CUDA graph; the other "
                 "engines' steps are always eager",
        "phase_timers": "--no-phase-timers switches off the megatron engine's phase timers; "
                        "use --engine megatron",
    }

    def violations(self, cfg: RunConfig) -> list[str]:
        out: list[str] = []
        p, o = cfg.parallel, cfg.optim
        if cfg.workload.is_moe and p.tp > 1 and not p.sp:
            out.append("a mixture-of-experts workload with --tp > 1 needs --sp: megatron-core "
                       "requires sequence parallelism for MoE layers under tensor parallelism")
        out.extend(self.unknown_speed(cfg))
        w = cfg.workload
        if "grouped_gemm" in (cfg.speed or ()) and w.is_moe and w.add_bias_linear:
            out.append("--speed grouped_gemm: the grouped experts have no biases; this MoE "
                       "workload has add_bias_linear (drop grouped_gemm from --speed)")
        if o.fsdp and o.dist_optimizer:
            out.append("--fsdp and --dist-optimizer are exclusive (FSDP already shards the "
                       "optimizer)")
        if o.fsdp:
            out.extend(_megatron_fsdp_violations(cfg))
        return out

    def bytes_per_parameter(self, cfg: RunConfig) -> BytesPerParameter:
        # bf16 params, fp32 main_grad buffer (grad_reduce_in_fp32=True in
        # kit/engines/megatron/engine.py), fp32 master params + exp_avg + exp_avg_sq.
        return BytesPerParameter(weights=2, grads=4, optimizer=12)

    def sharding(self, cfg: RunConfig, zero_stage: int | None = None) -> Sharding:
        if cfg.optim.fsdp:
            return Sharding(weights=True, grads=True, optimizer=True)
        return Sharding(optimizer=cfg.optim.dist_optimizer)

    def placement(self, parallel: ParallelConfig, rank: int) -> dict[str, int]:
        """megatron-core's default ``order="tp-cp-ep-dp-pp"``: tensor-parallel ranks adjacent,
        then context, then data, pipeline stages slowest; expert groups use the same order with
        the expert tensor-parallel size (= tp by default) and no context parallelism."""
        p = parallel
        return {
            "tp_rank": rank % p.tp,
            "cp_rank": (rank // p.tp) % p.cp,
            "dp_rank": (rank // (p.tp * p.cp)) % p.dp,
            "pp_rank": rank // (p.tp * p.cp * p.dp),
            "ep_rank": (rank // p.tp) % p.ep,
        }

    def build(self) -> "Engine":
        from kit.engines.kernels.deferred_compile import deferred_torch_compile

        with deferred_torch_compile():  # its fusions' decorators would import inductor now
            import megatron.core  # noqa: F401

            importlib.import_module(self.engine_class.partition(":")[0])
        return super().build()

    def execution(self, cfg: RunConfig) -> Execution:
        return features.execution(cfg)

    def options_summary(self, cfg: RunConfig) -> str:
        return f"dist_optimizer={cfg.optim.dist_optimizer} fsdp={cfg.optim.fsdp}"


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
