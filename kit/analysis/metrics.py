"""Turn step records and telemetry rows into the bundle's summary metrics.

Definitions (docs/metrics.md has them with formulas): a step's wall time is the span from the
earliest rank's start to the latest rank's end (ranks start each step together after an
all-reduce); ``step_time_s`` is the median over measured steps; throughput counts the global
batch's tokens; TFLOP/s per device uses Megatron-LM's model-FLOPs formula; MFU divides by the
platform's dense peak for the run's dtype and is null when the platform declares none.
"""

import statistics
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kit.analysis.flops import model_flops_per_step
from kit.analysis.power import aggregate, device_metrics
from kit.spec.run import RunConfig

GIB = 1024**3


def step_spans(steps: pa.Table) -> dict[int, tuple[float, float]]:
    """Per measured step: (earliest start, latest end) across ranks."""
    measured = steps.filter(pc.equal(steps["phase"], "measured"))
    spans: dict[int, tuple[float, float]] = {}
    for s, t0, t1 in zip(
        measured["step"].to_pylist(), measured["t_start"].to_pylist(),
        measured["t_end"].to_pylist(), strict=True,
    ):
        a, b = spans.get(s, (t0, t1))
        spans[s] = (min(a, t0), max(b, t1))
    return spans


def in_windows(t: list[float], windows: list[tuple[float, float]]) -> list[bool]:
    """Whether each time lies in one of the (non-overlapping) windows; O(n log w)."""
    ordered = sorted(windows)
    starts = np.array([a for a, _ in ordered])
    ends = np.array([b for _, b in ordered])
    idx = np.searchsorted(starts, np.asarray(t, dtype=float), side="right") - 1
    ok = idx >= 0
    ok[ok] = np.asarray(t, dtype=float)[ok] <= ends[idx[ok]]
    return ok.tolist()


def power_summary(telemetry: pa.Table, windows: list[tuple[float, float]]) -> dict[str, Any]:
    """Mean/peak power and energy over the measured windows, from GPU rows or else host RAPL.

    Energy comes from the hardware counter (first to last reading in the windows) where one
    exists, else from integrating power over time (trapezoid); ``energy_source`` says which.
    """
    out: dict[str, Any] = {"power_w_mean": None, "power_w_peak": None, "energy_j": None,
                           "energy_source": None, "temp_gpu_c_max": None,
                           "temp_gpu_c_spread": None}
    if telemetry.num_rows == 0 or not windows:
        return out
    rows = telemetry.to_pylist()
    inside = in_windows([r["t"] for r in rows], windows)
    rows = [r for r, ok in zip(rows, inside, strict=True) if ok]
    gpu = [r for r in rows if r["source"] == "gpu" and r["power_w"] is not None]
    host = [r for r in rows if r["source"] == "host" and r["cpu_power_w"] is not None]
    series: dict[Any, list[tuple[float, float]]] = {}
    key = "power_w" if gpu else "cpu_power_w"
    for r in gpu or host:
        series.setdefault((r["node"], r["device"]), []).append((r["t"], r[key]))
    if not series:
        return out
    per_dev_mean = [statistics.fmean(p for _, p in v) for v in series.values()]
    out["power_w_mean"] = statistics.fmean(per_dev_mean)
    out["power_w_peak"] = max(p for v in series.values() for _, p in v)
    counters = [r for r in gpu if r["energy_j"] is not None]
    if counters:
        by_dev: dict[Any, list[float]] = {}
        for r in counters:
            by_dev.setdefault((r["node"], r["device"]), []).append(r["energy_j"])
        total = sum(max(v) - min(v) for v in by_dev.values())
        out["energy_j"], out["energy_source"] = total, "hardware counter"
    else:
        total = 0.0
        for v in series.values():
            v.sort()
            t, p = np.array([x for x, _ in v]), np.array([y for _, y in v])
            total += float(np.sum(np.diff(t) * (p[1:] + p[:-1]) / 2))
        out["energy_j"], out["energy_source"] = total, f"integrated {key}"
    temps: dict[Any, float] = {}
    for r in rows:
        if r["source"] == "gpu" and r["temp_gpu_c"] is not None:
            k = (r["node"], r["device"])
            temps[k] = max(temps.get(k, r["temp_gpu_c"]), r["temp_gpu_c"])
    if temps:
        out["temp_gpu_c_max"] = max(temps.values())
        out["temp_gpu_c_spread"] = max(temps.values()) - min(temps.values())
    return out


def summarize(
    cfg: RunConfig,
    steps: pa.Table,
    telemetry: pa.Table,
    mem_peak_bytes: list[int | None],
    devices: list[dict[str, Any]],
    excursion_frac: float = 0.9,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any], list[str]]:
    """The canonical summary, per-device metrics, power detail and notes on the sources.

    Power and thermal figures come from GPU rows where the run has them (see
    :mod:`kit.analysis.power`), else from host RAPL power when the host exposes it.
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
    tokens_measured = cfg.tokens_per_step * len(spans)
    per_device = device_metrics(telemetry, steps, devices, excursion_frac)
    if per_device:
        power = aggregate(per_device, tokens_measured, len(spans))
        power["excursion_frac"] = excursion_frac
    else:
        host = power_summary(telemetry, list(spans.values()))
        power = {**host, "energy_j_per_token": host["energy_j"] / tokens_measured
                 if host["energy_j"] is not None and tokens_measured else None}
    if power.get("energy_source"):
        notes.append(f"energy: {power['energy_source']}")
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
