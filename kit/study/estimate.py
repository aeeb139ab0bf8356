"""How long the study's runs take, before they run: start-up plus steps at an assumed MFU.

A point costs its start-up (launch to first step: ranks, imports, model build) plus its steps.
Start-up was measured at about 25 s per point on 4 H100/H200s after the start-up work, and
33 s for two gpt3-tiny ranks on the project's busy 2-core CPU host (launch_to_first_step_s of
its bundles). A step takes the model FLOPs (Megatron-LM's count, 4/3 of it with full
recomputation) at :data:`ASSUMED_MFU` of the platform's peak; a cpu step of gpt3-tiny takes
:data:`CPU_SAMPLE_S` per sample of a data-parallel replica. While the study runs, the time left is
the estimate of the points left scaled by how the finished ones compared with theirs.
"""

from kit.config.run import RunConfig
from kit.metrics.flops import model_flops_per_step

GPU_STARTUP_S = 25.0
CPU_STARTUP_S = 33.0
ASSUMED_MFU = 0.3
"""The study's layouts on 4 H200s reached MFU 0.30-0.39 (issue 38); the lower end is safer."""
CPU_SAMPLE_S = 0.1
"""gpt3-tiny on cpu, seconds per sample of a data-parallel replica: a PP2 step of 16 samples
took 1.6-4.7 s on the busy 2-core host."""
FABRIC_S = {"cpu": 40.0, "gpu": 60.0}
"""The fabric benchmark's run (three collectives at two or three sizes), start-up included."""
REPORT_S = 30.0
"""Findings and the report over about a dozen bundles."""


def startup_s(cfg: RunConfig) -> float:
    """The start-up of one point of ``cfg``'s platform."""
    return CPU_STARTUP_S if cfg.platform.is_cpu else GPU_STARTUP_S


def step_s(cfg: RunConfig) -> float:
    """One optimizer step of ``cfg``, predicted."""
    if cfg.platform.is_cpu:
        return CPU_SAMPLE_S * cfg.global_batch_size / cfg.parallel.dp
    flops = model_flops_per_step(cfg.workload, cfg.global_batch_size, cfg.parallel.tp)
    if cfg.optim.recompute == "full":
        flops *= 4 / 3  # the forward pass runs twice: 3 passes of work become 4
    peak = cfg.platform.peak_tflops.get(cfg.dtype)
    if not peak:  # a platform without a declared peak: as slow as cpu, to be safe
        return CPU_SAMPLE_S * cfg.global_batch_size / cfg.parallel.dp
    return flops / (cfg.world_size * peak * 1e12 * ASSUMED_MFU)


def point_s(cfg: RunConfig) -> float:
    """The whole point: start-up, warmup and measured steps."""
    return startup_s(cfg) + cfg.total_steps * step_s(cfg)


def fmt_duration(seconds: float) -> str:
    """``12 min 30 s`` or ``45 s``."""
    s = round(seconds)
    return f"{s // 60} min {s % 60:02d} s" if s >= 60 else f"{s} s"
