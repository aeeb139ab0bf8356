"""Turn step records and telemetry rows into the bundle's summary metrics.

Definitions (docs/metrics.md has them with formulas): a step's wall time is the span from the
earliest rank's start to the latest rank's end (ranks start each step together after an
all-reduce); ``step_time_s`` is the median over measured steps; throughput counts the global
batch's tokens; TFLOP/s per device uses Megatron-LM's model-FLOPs formula; MFU divides by the
platform's dense peak for the run's dtype and is null when the platform declares none.
"""

import statistics
from typing import Any

import pyarrow as pa

from kit.config.run import RunConfig
from kit.metrics.attribution import MEASURED, step_windows
from kit.metrics.flops import model_flops_per_step
from kit.metrics.power import device_metrics, host_power

GIB = 1024**3


def step_spans(steps: pa.Table) -> dict[int, tuple[float, float]]:
    """Per measured step: (earliest start, latest end) across ranks."""
    w = step_windows(steps)
    m = w.phase == MEASURED
    return {int(s): (float(a), float(b)) for s, a, b in zip(w.step[m], w.start[m], w.end[m],
                                                            strict=True)}


def summarize(
    cfg: RunConfig,
    steps: pa.Table,
    telemetry: pa.Table,
    mem_peak_bytes: list[int | None],
    devices: list[dict[str, Any]],
    excursion_frac: float = 0.9,
    zeus_phase_j: list[float | None] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any], list[str]]:
    """The canonical summary, per-device metrics, power detail and notes on the sources.

    Power and thermal figures come from GPU rows where the run has them (see
    :mod:`kit.metrics.power`), else from host RAPL power when the host exposes it.

    Args:
        cfg: The resolved run.
        steps: Rows of ``STEPS_SCHEMA``.
        telemetry: Rows of ``TELEMETRY_SCHEMA``.
        mem_peak_bytes: Peak device (or process) memory of each rank; None = unknown.
        devices: Static device facts (``node``, ``device``, ``power_limit_w``,
            ``clock_sm_max_mhz``) for excursions and the clock fraction.
        excursion_frac: Excursion threshold as a fraction of the power limit.
        zeus_phase_j: Zeus's energy of each rank's GPU over its measured phase, for every rank
            that ran measured steps (:func:`kit.metrics.power.zeus_cross_check`).

    Returns:
        ``(summary, per_device, power, notes)``: the ``SUMMARY_KEYS`` dict, one dict per
        device, the job-level power/thermal detail (``MetricsFile.power``) and notes.
    """
    notes: list[str] = []
    spans = step_spans(steps)
    durations = [b - a for a, b in spans.values()]
    step_time = statistics.median(durations) if durations else None
    tokens_per_s = cfg.tokens_per_step / step_time if step_time else None
    tflops = mfu = None
    if step_time:
        tflops = model_flops_per_step(cfg.workload, cfg.global_batch_size, cfg.parallel.tp)
        tflops = tflops / step_time / cfg.world_size / 1e12
        peak = cfg.platform.peak_tflops.get(cfg.dtype)
        if peak:
            mfu = tflops / peak
        else:
            notes.append(f"mfu: platform {cfg.platform.name} declares no {cfg.dtype} peak")
    per_device, power = device_metrics(telemetry, steps, devices, cfg.tokens_per_step,
                                       excursion_frac, zeus_phase_j or ())
    if not per_device:
        power = host_power(telemetry, steps, cfg.tokens_per_step)
    if power.get("energy_source"):
        notes.append(f"energy: {power['energy_source']}")
    if power.get("energy_steps") is not None and power["energy_steps"] < len(spans):
        notes.append(f"energy: over the {power['energy_steps']} of {len(spans)} measured steps "
                     "the telemetry covers (its sampler stopped before the last ones ended)")
    mem = [m for m in mem_peak_bytes if m is not None]
    if cfg.platform.is_cpu:
        notes.append("mem_peak_gib: peak resident set size of a rank process (cpu platform)")
    summary = {
        "step_time_s": step_time,
        "tokens_per_s": tokens_per_s,
        "tflops_per_gpu": tflops,
        "mfu": mfu,
        "energy_j_per_token": power.get("energy_j_per_token"),
        "power_w_mean": power.get("power_w_mean"),
        "power_w_peak": power.get("power_w_peak"),
        "temp_gpu_c_max": power.get("temp_gpu_c_max"),
        "temp_gpu_c_spread": power.get("temp_gpu_c_spread"),
        "clock_sm_frac_of_max": power.get("clock_sm_frac_of_max"),
        "throttle_frac": power.get("throttle_frac"),
        "mem_peak_gib": max(mem) / GIB if mem else None,
        "world_size": cfg.world_size,
    }
    return summary, per_device, power, notes
