"""Per-device power and thermal metrics over the measured steps, and their aggregate.

Every sample is first attributed to a step and a phase (``attribute``): a step's window runs
from the earliest rank's start to the latest rank's end; samples outside every step window are
``idle``. Only GPU rows of measured windows count below. Definitions (docs/metrics.md):

* energy: the hardware counter's rise inside each measured window (last minus first sample),
  summed; without a counter, power integrated over time (trapezoid) in each window.
* peak-to-mean: a device's highest power sample over its mean power; the job's is the worst
  (largest) device's.
* excursion: a run of consecutive samples at or above ``excursion_frac`` x the device's
  enforced power limit; its duration runs from its first sample to the first sample below
  (or its last sample).
* clock fraction: mean SM clock over the device's maximum SM clock.
* throttle fraction: share of samples with any kit throttle bit set, and per reason.
* temperature spread: hottest minus coolest per-device mean GPU temperature.

A figure that cannot be computed is None (never 0).
"""

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kit.bundle.schema import THROTTLE_BITS


def attribute(t: np.ndarray, steps: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Step index (-1 outside steps) and phase of each sample time; O(n log s)."""
    spans: dict[int, tuple[float, float]] = {}
    phases: dict[int, str] = {}
    for s, ph, a, b in zip(steps["step"].to_pylist(), steps["phase"].to_pylist(),
                           steps["t_start"].to_pylist(), steps["t_end"].to_pylist(), strict=True):
        lo, hi = spans.get(s, (a, b))
        spans[s], phases[s] = (min(lo, a), max(hi, b)), ph
    order = sorted(spans, key=lambda s: spans[s][0])
    starts = np.array([spans[s][0] for s in order])
    ends = np.array([spans[s][1] for s in order])
    idx = np.searchsorted(starts, t, side="right") - 1
    inside = (idx >= 0) & (t <= ends[np.clip(idx, 0, None)]) if len(order) else idx >= 0
    step = np.where(inside, np.array(order)[np.clip(idx, 0, None)] if order else -1, -1)
    phase = np.array(["idle"] * len(t), dtype=object)
    for s in order:
        phase[step == s] = phases[s]
    return step, phase


def _runs_above(t: np.ndarray, p: np.ndarray, threshold: float) -> tuple[int, float]:
    """Count and total seconds of runs of samples with ``p >= threshold``."""
    above = p >= threshold
    if not above.any():
        return 0, 0.0
    edges = np.diff(above.astype(int), prepend=0, append=0)
    begins, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    total = sum(t[min(e, len(t) - 1)] - t[b] for b, e in zip(begins, stops, strict=True))
    return len(begins), float(total)


def _mean(x: np.ndarray) -> float | None:
    x = x[~np.isnan(x)]
    return float(x.mean()) if len(x) else None


def _device(rows: dict[str, np.ndarray], windows: np.ndarray, facts: dict[str, Any],
            excursion_frac: float) -> dict[str, Any]:
    """Metrics of one device from its measured samples (arrays sorted by time)."""
    t, p, e = rows["t"], rows["power_w"], rows["energy_j"]
    out: dict[str, Any] = {"samples": len(t)}
    energy, source = 0.0, None
    for w in np.unique(windows):
        sel = windows == w
        if sel.sum() < 2:
            continue
        if not np.isnan(e[sel]).any():
            energy, source = energy + float(e[sel][-1] - e[sel][0]), "counter"
        elif not np.isnan(p[sel]).any():
            ts, ps = t[sel], p[sel]
            energy += float(np.sum(np.diff(ts) * (ps[1:] + ps[:-1]) / 2))
            source = source or "integrated power"
    out["energy_j"], out["energy_source"] = (energy, source) if source else (None, None)
    out["power_w_mean"] = _mean(p)
    out["power_w_peak"] = float(np.nanmax(p)) if not np.isnan(p).all() else None
    out["peak_to_mean"] = (out["power_w_peak"] / out["power_w_mean"]
                           if out["power_w_mean"] else None)
    limit = facts.get("power_limit_w")
    if limit and not np.isnan(p).all():
        n, dur = _runs_above(t, np.nan_to_num(p), excursion_frac * limit)
        out["excursions"], out["excursion_s"] = n, dur
    else:
        out["excursions"] = out["excursion_s"] = None
    temp = rows["temp_gpu_c"]
    out["temp_gpu_c_mean"], out["temp_gpu_c_max"] = _mean(temp), (
        float(np.nanmax(temp)) if not np.isnan(temp).all() else None)
    clock, clock_max = _mean(rows["clock_sm_mhz"]), facts.get("clock_sm_max_mhz")
    out["clock_sm_frac_of_max"] = clock / clock_max if clock and clock_max else None
    thr = rows["throttle"]
    known = thr[~np.isnan(thr)].astype(np.int64)
    out["throttle_frac"] = float((known != 0).mean()) if len(known) else None
    out["throttle_frac_by_reason"] = (
        {name: float(((known & bit) != 0).mean()) for name, bit in THROTTLE_BITS.items()}
        if len(known) else None
    )
    return out


FIELDS = ("t", "power_w", "energy_j", "temp_gpu_c", "clock_sm_mhz", "throttle")


def device_metrics(telemetry: pa.Table, steps: pa.Table, devices: list[dict[str, Any]],
                   excursion_frac: float = 0.9) -> list[dict[str, Any]]:
    """Metrics of every GPU over the measured steps, one dict per (node, device)."""
    gpu = telemetry.filter(pc.equal(telemetry["source"], "gpu"))
    if gpu.num_rows == 0 or steps.num_rows == 0:
        return []
    cols = {f: gpu[f].to_numpy(zero_copy_only=False).astype(float) for f in FIELDS}
    node = gpu["node"].to_numpy(zero_copy_only=False)
    dev = gpu["device"].to_numpy(zero_copy_only=False)
    step, phase = attribute(cols["t"], steps)
    measured = phase == "measured"
    facts = {(d.get("node", 0), d["device"]): d for d in devices if "device" in d}
    out = []
    for n, d in sorted({(int(a), int(b)) for a, b in zip(node, dev, strict=True)}):
        sel = measured & (node == n) & (dev == d)
        if not sel.any():
            continue
        order = np.argsort(cols["t"][sel])
        rows = {f: v[sel][order] for f, v in cols.items()}
        m = _device(rows, step[sel][order], facts.get((n, d), {}), excursion_frac)
        out.append({"node": n, "device": d, **m})
    return out


def aggregate(per_device: list[dict[str, Any]], tokens: int, measured_steps: int) -> dict[str, Any]:
    """Job-level figures from per-device metrics (None where no device has the figure)."""
    def vals(key: str) -> list[float]:
        return [d[key] for d in per_device if d.get(key) is not None]

    energy = vals("energy_j")
    means, temps = vals("temp_gpu_c_mean"), vals("temp_gpu_c_max")
    samples = sum(d["samples"] for d in per_device if d.get("throttle_frac") is not None)
    by_reason = None
    if samples:
        by_reason = {name: sum(d["throttle_frac_by_reason"][name] * d["samples"]
                               for d in per_device if d.get("throttle_frac_by_reason"))
                     / samples for name in THROTTLE_BITS}
    return {
        "energy_j": sum(energy) if energy else None,
        "energy_source": next((d["energy_source"] for d in per_device if d["energy_source"]),
                              None),
        "energy_j_per_token": sum(energy) / tokens if energy and tokens else None,
        "energy_j_per_step": sum(energy) / measured_steps if energy and measured_steps else None,
        "power_w_mean": float(np.mean(vals("power_w_mean"))) if vals("power_w_mean") else None,
        "power_w_peak": max(vals("power_w_peak"), default=None),
        "peak_to_mean": max(vals("peak_to_mean"), default=None),
        "excursions": sum(vals("excursions")) if vals("excursions") else None,
        "excursion_s": sum(vals("excursion_s")) if vals("excursion_s") else None,
        "temp_gpu_c_max": max(temps, default=None),
        "temp_gpu_c_spread": max(means) - min(means) if means else None,
        "clock_sm_frac_of_max": (float(np.mean(vals("clock_sm_frac_of_max")))
                                 if vals("clock_sm_frac_of_max") else None),
        "throttle_frac": (sum(d["throttle_frac"] * d["samples"] for d in per_device
                              if d.get("throttle_frac") is not None) / samples
                          if samples else None),
        "throttle_frac_by_reason": by_reason,
    }
