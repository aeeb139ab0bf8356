"""Per-device power and thermal metrics over the measured steps, and the job's aggregate.

Samples are attributed to steps first (:mod:`kit.metrics.attribution`); only rows of the
wanted source (``gpu``, or ``host`` for the RAPL fallback) inside measured step windows count.
Per device (one ``(node, device)`` series, samples in time order):

* ``energy_j``: the hardware counter's rise inside the measured step windows (``energy_source``
  ``counter``): the rise between two readings in one window counts whole; between readings in
  consecutive steps' windows it is split linearly and only the share inside the windows counts,
  so the readings' spacing does not drop the energy at each step's edges. A device without two
  counter readings integrates its power (``power_field``) the same way (trapezoid, ``integrated
  power``). Only the stretch before the measured phase's first reading and after its last is
  left out (under one sampling period at each end). The windows counted (``energy_steps``) are
  the measured steps that end before every device's last sample: all of them in a run whose
  sampler outlived its steps, those before the sampler stopped in one stopped by a signal (its
  ranks finish their step after the sampler has stopped). ``energy_j_per_step``: ``energy_j``
  / ``energy_steps``; energy per token likewise over those steps' tokens.
* ``power_field``: which power column the device's power figures use: ``power_w``
  (instantaneous) where the device has readings of it, else ``power_avg_w`` (the driver's
  windowed average, e.g. an MI250, whose AMD SMI gives no current power). An average smooths
  the swings that peak-to-mean and excursions measure, so a device that has both uses the
  instantaneous one.
* ``power_w_mean`` / ``power_w_peak``: mean and highest power sample; ``peak_to_mean`` their
  ratio.
* Excursions: maximal runs of consecutive measured power samples above ``excursion_frac``
  x the device's power limit (the short gaps between steps, and rows without a power reading,
  such as a slow counter's own rows, do not split a run). A run lasts from its first sample to
  the next measured power sample (the first one back below), or to its own last sample when
  no such sample follows. ``excursions`` counts runs, ``excursion_s`` sums durations; both
  null without a known limit or without power readings.
* ``temp_gpu_c_mean`` / ``temp_gpu_c_max``, ``temp_mem_c_max``, ``util_gpu_pct_mean``.
* ``clock_sm_frac_of_max``: mean SM clock / the device's maximum SM clock.
* ``throttle_frac``: share of samples (with a throttle reading) with any kit bit set;
  ``throttle_frac_by_reason``: the same per bit of ``THROTTLE_BITS`` (bits combine, so the
  reasons' fractions may sum to more than ``throttle_frac``).

The aggregate sums energy over devices (null unless every device has it; ``energy_source`` is
``mixed`` when devices used different sources; ``power_field`` likewise), averages the
per-device means (power, clock fraction, utilization), takes the maximum of peaks and temperatures,
and ``peak_to_mean`` of the worst (largest) device, since the job's power delivery must absorb
its worst device's swings. ``temp_gpu_c_spread`` is the hottest minus the coolest per-device
mean temperature; throttle fractions pool all devices' samples; excursion counts and seconds
add up. ``zeus_energy_j`` and ``zeus_vs_counter`` cross-check the counter against Zeus's own
step windows (:func:`zeus_cross_check`). A figure that cannot be computed is None, never 0.

Rows are grouped per device by one stable radix sort of small integer codes, O(n); a device
whose rows are not in time order (a slow counter's own rows come in write order, not time
order) is then sorted by time. Each device's figures are vectorized over its samples, reading
only its rows of each column.
"""

import statistics
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kit.bundle.telemetry_fields import THROTTLE_BITS
from kit.measure_window import MIN_COUNTER_READINGS, MIN_POWER_SAMPLES
from kit.metrics.attribution import MEASURED, StepWindows, step_windows, window_index
from kit.metrics.energy import device_energy

_CODES = 64
"""Throttle values counted one by one: every OR of the six kit bits (0..63)."""

STEADY_TAIL = 1 / 3
"""The last share of the measured window whose temperature slope decides steady state."""

TEMP_STEADY_C_PER_MIN = 1.0
"""A device whose temperature changes by at most this over the window's tail is steady."""


class _Series(NamedTuple):
    """One device's (for host rows: one node's) samples, in time order."""

    node: int
    device: int | None
    t: np.ndarray
    window: np.ndarray
    """Index of each sample's step window, -1 outside every window."""
    rows: np.ndarray
    """Row of each sample in the telemetry table."""
    measured: np.ndarray
    """Whether each sample lies inside a measured step's window."""


def _ints(col: pa.ChunkedArray) -> np.ndarray:
    """An integer column as a numpy array, null as -1."""
    return (pc.fill_null(col, -1) if col.null_count else col).to_numpy()


def _series(telemetry: pa.Table, windows: StepWindows, source: str) -> list[_Series]:
    """Rows of ``source``, one entry per (node, device) sampled inside the measured steps or on
    both sides of them, by node/device; every row of such a device is kept (its energy counter
    is interpolated across the windows' edges), each marked measured or not."""
    if telemetry.num_rows == 0:
        return []
    t = telemetry["t"].to_numpy()
    window = window_index(t, windows)
    measured = np.r_[windows.phase == MEASURED, False][window]  # window -1: not measured
    keep = pc.equal(telemetry["source"], source).to_numpy(zero_copy_only=False)
    kept = int(np.count_nonzero(keep))
    is_measured = windows.phase == MEASURED
    if not kept or not is_measured.any():
        return []
    lo, hi = windows.start[is_measured].min(), windows.end[is_measured].max()
    node, dev = _ints(telemetry["node"]), _ints(telemetry["device"])  # device -1 on host rows
    span = int(dev.max()) + 2
    key = node.astype(np.int32 if (int(node.max()) + 1) * span < 2**31 else np.int64)
    key *= span
    key += dev + 1
    left_out = int(key.max()) + 1  # the last code, sorted last
    key[~keep] = left_out
    counts = np.bincount(key, minlength=left_out + 1)
    present = np.flatnonzero(counts[:-1])
    lut = np.full(len(counts), len(present), np.uint16 if len(present) < 2**16 - 1 else np.intp)
    lut[present] = np.arange(len(present))
    order = np.argsort(lut[key], kind="stable")[:kept]  # a radix sort for these small codes
    series = []
    for k, rows in zip(present, np.split(order, np.cumsum(counts[present])[:-1]), strict=True):
        if not np.any(measured[rows]) and not (t[rows].min() <= hi and t[rows].max() >= lo):
            continue  # neither sampled inside the measured steps nor around them
        if np.any(t[rows[1:]] < t[rows[:-1]]):  # slow rows are written as their reads end
            rows = rows[np.argsort(t[rows], kind="stable")]
        series.append(_Series(int(k // span), int(k % span) - 1 if k % span else None,
                              t[rows], window[rows], rows, measured[rows]))
    return series


def _values(telemetry: pa.Table, name: str, rows: np.ndarray) -> np.ndarray:
    """A column's values at ``rows`` as floats, NaN = null, without copying the whole column."""
    col = telemetry[name]
    if col.null_count == len(col):
        return np.full(len(rows), np.nan)
    if col.num_chunks == 1 and col.null_count == 0:
        return col.chunk(0).to_numpy()[rows].astype(float, copy=False)
    return col.take(rows).to_numpy(zero_copy_only=False).astype(float, copy=False)


def _stats(x: np.ndarray) -> tuple[float | None, float | None]:
    """Mean and max over the non-NaN values, or None."""
    x = x[~np.isnan(x)]
    return (float(x.mean()), float(x.max())) if len(x) else (None, None)


def _excursions(t: np.ndarray, p: np.ndarray, threshold: float) -> tuple[int, float]:
    """Number and total seconds of runs of samples above ``threshold`` (module docstring)."""
    read = ~np.isnan(p)
    t, p = t[read], p[read]
    edges = np.diff((p > threshold).astype(np.int8), prepend=0, append=0)
    begin, after = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    nxt = np.minimum(after, len(p) - 1)
    back = after < len(p)
    return len(begin), float(np.sum(np.where(back, t[nxt], t[after - 1]) - t[begin]))


def _throttle_counts(throttle: np.ndarray) -> np.ndarray:
    """How many samples had each throttle value 0..63 (nulls left out)."""
    return np.bincount(throttle[throttle >= 0].astype(np.int64) & (_CODES - 1), minlength=_CODES)


def _throttle_fracs(counts: np.ndarray) -> tuple[float | None, dict[str, float] | None]:
    """Share of samples with any kit bit set, and per bit, from value counts (or None)."""
    known = int(counts.sum())
    if not known:
        return None, None
    value = np.arange(_CODES)
    return (int(counts[1:].sum()) / known,
            {name: int(counts[(value & bit) != 0].sum()) / known
             for name, bit in THROTTLE_BITS.items()})


def _power(telemetry: pa.Table, rows: np.ndarray) -> tuple[np.ndarray, str | None]:
    """The device's power samples: instantaneous where it has any, else averaged (module
    docstring), and which column that is; all NaN and None without either."""
    for name in ("power_w", "power_avg_w"):
        power = _values(telemetry, name, rows)
        if not np.all(np.isnan(power)):
            return power, name
    return power, None


def _temp_slope(t: np.ndarray, temp: np.ndarray) -> float | None:
    """Least-squares slope of temperature over the last :data:`STEADY_TAIL` of the samples'
    span, degrees C per minute (None with fewer than three readings there)."""
    read = ~np.isnan(temp)
    t, temp = t[read], temp[read]
    if len(t) < 3:
        return None
    tail = t >= t[-1] - STEADY_TAIL * (t[-1] - t[0])
    if np.count_nonzero(tail) < 3 or np.ptp(t[tail]) <= 0:
        return None
    return float(np.polyfit(t[tail], temp[tail], 1)[0] * 60.0)


def _rel(a: float | None, b: float | None) -> float | None:
    """``a / b - 1``, or None when either is unknown or ``b`` is not positive."""
    return a / b - 1 if a is not None and b else None


def sampled_steps(windows: StepWindows, series: list[_Series]) -> np.ndarray:
    """Which step windows count for energy (module docstring): the measured ones that end
    before every device's last row. A window before a device's first row still counts (its
    energy is then unknown, None): a sampler that started late is a gap, not a stop."""
    counted = windows.phase == MEASURED
    for s in series:
        counted &= windows.end <= s.t[-1]
    return counted


def _device(telemetry: pa.Table, s: _Series, windows: StepWindows, fact: dict[str, Any],
            excursion_frac: float, counted: np.ndarray) -> tuple[dict[str, Any], np.ndarray]:
    """One device's figures, and its throttle value counts for the job's pooled fractions;
    its energy over the ``counted`` windows (:func:`sampled_steps`)."""
    power_all, power_field = _power(telemetry, s.rows)
    m = s.measured
    rows, t, power = s.rows[m], s.t[m], power_all[m]
    is_measured = windows.phase == MEASURED
    energy_steps = int(np.count_nonzero(counted))
    got = device_energy(windows, counted, s.t, _values(telemetry, "energy_j", s.rows),
                        power_all)
    energy, source = got.counter_j, "counter"
    if energy is None:
        energy, source = got.integral_j, "integrated power"
    p_mean, p_peak = _stats(power)
    power_samples = int(np.count_nonzero(~np.isnan(power)))
    window_s = float(windows.end[is_measured].max() - windows.start[is_measured].min())
    short = (None if power_field is None and not got.counter_readings
             else bool((power_field is not None and power_samples < MIN_POWER_SAMPLES)
                       or 0 < got.counter_readings < MIN_COUNTER_READINGS))
    limit, clock_max = fact.get("power_limit_w"), fact.get("clock_sm_max_mhz")
    runs, run_s = (_excursions(t, power, excursion_frac * limit)
                   if limit and p_mean is not None else (None, None))
    temps = _values(telemetry, "temp_gpu_c", rows)
    temp_mean, temp_max = _stats(temps)
    slope = _temp_slope(t, temps)
    clock = _stats(_values(telemetry, "clock_sm_mhz", rows))[0]
    counts = _throttle_counts(_values(telemetry, "throttle", rows))
    frac, by_reason = _throttle_fracs(counts)
    return {
        "node": s.node, "device": s.device, "samples": len(t),
        "power_samples": power_samples, "counter_readings": got.counter_readings,
        "window_s": window_s, "window_short": short,
        "energy_j": energy, "energy_source": source if energy is not None else None,
        "energy_j_per_step": energy / energy_steps if energy is not None else None,
        "counter_coverage": got.counter_coverage,
        "span_energy_j": got.span_counter_j,
        "power_integral_j": got.integral_j,
        "counter_vs_integral": _rel(got.counter_j, got.integral_j),
        "power_field": power_field, "power_w_mean": p_mean, "power_w_peak": p_peak,
        "peak_to_mean": p_peak / p_mean if p_mean else None, "power_limit_w": limit,
        "excursions": runs, "excursion_s": run_s,
        "temp_gpu_c_mean": temp_mean, "temp_gpu_c_max": temp_max,
        "temp_slope_c_per_min": slope,
        "temp_steady": abs(slope) <= TEMP_STEADY_C_PER_MIN if slope is not None else None,
        "temp_mem_c_max": _stats(_values(telemetry, "temp_mem_c", rows))[1],
        "clock_sm_frac_of_max": clock / clock_max if clock is not None and clock_max else None,
        "util_gpu_pct_mean": _stats(_values(telemetry, "util_gpu_pct", rows))[0],
        "throttle_frac": frac, "throttle_frac_by_reason": by_reason,
    }, counts


def _fmean(values: list[float]) -> float | None:
    """Mean of ``values``, or None when there are none."""
    return statistics.fmean(values) if values else None


def _per_token(energy: float | None, tokens_per_step: int, steps: int) -> dict[str, Any]:
    """Energy per token and per step over ``steps`` measured steps (None if unknown)."""
    return {"energy_j_per_token": energy / (tokens_per_step * steps)
            if energy is not None and tokens_per_step and steps else None,
            "energy_j_per_step": energy / steps if energy is not None and steps else None}


def _aggregate(per_device: list[dict[str, Any]], counts: np.ndarray, tokens_per_step: int,
               energy_steps: int, excursion_frac: float) -> dict[str, Any]:
    """The job's figures from the devices' (module docstring); all None without devices."""
    def known(key: str) -> list[Any]:
        return [d[key] for d in per_device if d[key] is not None]

    energies = [d["energy_j"] for d in per_device]
    total = sum(energies) if energies and None not in energies else None
    sources = {d["energy_source"] for d in per_device}
    power_fields = set(known("power_field"))
    means = known("temp_gpu_c_mean")
    frac, by_reason = _throttle_fracs(counts)
    integrals = [d["power_integral_j"] for d in per_device]
    spans = [d["span_energy_j"] for d in per_device]
    integral = sum(integrals) if integrals and None not in integrals else None
    counters = all(d["energy_source"] == "counter" for d in per_device)
    steady = known("temp_steady")
    return {
        "energy_j": total,
        "energy_source": (None if total is None
                          else sources.pop() if len(sources) == 1 else "mixed"),
        **_per_token(total, tokens_per_step, energy_steps),
        "power_integral_j": integral,
        "counter_vs_integral": _rel(total, integral) if counters else None,
        "span_energy_j": (sum(spans) if counters and spans and None not in spans else None),
        "counter_coverage_min": min(known("counter_coverage"), default=None),
        "power_samples_min": min((d["power_samples"] for d in per_device), default=None),
        "counter_readings_min": min((d["counter_readings"] for d in per_device), default=None),
        "window_s": max((d["window_s"] for d in per_device), default=None),
        "window_short": any(known("window_short")) if known("window_short") else None,
        "temp_steady": all(steady) if steady else None,
        "power_field": (None if not power_fields
                        else power_fields.pop() if len(power_fields) == 1 else "mixed"),
        "power_w_mean": _fmean(known("power_w_mean")),
        "power_w_peak": max(known("power_w_peak"), default=None),
        "peak_to_mean": max(known("peak_to_mean"), default=None),
        "excursion_frac": excursion_frac,
        "excursions": sum(known("excursions")) if known("excursions") else None,
        "excursion_s": sum(known("excursion_s")) if known("excursion_s") else None,
        "temp_gpu_c_max": max(known("temp_gpu_c_max"), default=None),
        "temp_gpu_c_spread": max(means) - min(means) if means else None,
        "temp_mem_c_max": max(known("temp_mem_c_max"), default=None),
        "clock_sm_frac_of_max": _fmean(known("clock_sm_frac_of_max")),
        "util_gpu_pct_mean": _fmean(known("util_gpu_pct_mean")),
        "throttle_frac": frac,
        "throttle_frac_by_reason": by_reason,
    }


def device_metrics(
    telemetry: pa.Table,
    steps: pa.Table,
    devices: list[dict[str, Any]],
    tokens_per_step: int,
    excursion_frac: float = 0.9,
    zeus_phase_j: Sequence[float | None] = (),
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Power and thermal metrics of every GPU over the measured steps, and their aggregate.

    Args:
        telemetry: Rows of ``TELEMETRY_SCHEMA``; only ``source == "gpu"`` rows are used.
        steps: Rows of ``STEPS_SCHEMA``.
        devices: Static facts per device: ``node`` (default 0), ``device``, ``power_limit_w``
            and ``clock_sm_max_mhz`` (either may be missing or None).
        tokens_per_step: Tokens the whole job trains per step (global batch x sequence).
        excursion_frac: Excursion threshold as a fraction of the power limit.
        zeus_phase_j: Zeus's energy of each rank's GPU over the measured phase
            (:func:`zeus_cross_check`).

    Returns:
        ``(per_device, aggregate)``: one dict per (node, device) with measured samples, in
        (node, device) order, and the job-level dict (definitions in the module docstring).
    """
    windows = step_windows(steps)
    measured_steps = int(np.count_nonzero(windows.phase == MEASURED))
    facts = {(d.get("node", 0), d.get("device")): d for d in devices}
    per_device, counts = [], np.zeros(_CODES, np.int64)
    series = _series(telemetry, windows, "gpu")
    counted = sampled_steps(windows, series)
    energy_steps = int(np.count_nonzero(counted))
    for s in series:
        figures, device_counts = _device(telemetry, s, windows, facts.get((s.node, s.device), {}),
                                         excursion_frac, counted)
        per_device.append(figures)
        counts += device_counts
    aggregate = _aggregate(per_device, counts, tokens_per_step, energy_steps, excursion_frac)
    aggregate["energy_steps"] = energy_steps if per_device else None
    zeus = zeus_cross_check(steps, aggregate, len(per_device), zeus_phase_j)
    if energy_steps < measured_steps:  # Zeus's window spans every measured step
        zeus["zeus_vs_counter"] = None
    checks = [abs(x) for x in (*(d["counter_vs_integral"] for d in per_device),
                               aggregate["counter_vs_integral"], zeus["zeus_vs_counter"])
              if x is not None]
    return per_device, {**aggregate, **zeus, "energy_check_max": max(checks, default=None)}


def zeus_cross_check(steps: pa.Table, aggregate: dict[str, Any], devices: int,
                     zeus_phase_j: Sequence[float | None] = ()) -> dict[str, Any]:
    """Zeus's energy over the measured steps against the sampled hardware counter's.

    Zeus measures each rank's GPU over one window around the whole measured phase
    (``zeus_phase_j``, one entry per rank that ran measured steps; ``metrics.json``
    ``per_rank[].zeus_measured_energy_j``), compared with the counter's rise over the same span
    (``span_energy_j``: the gaps between steps included, where a profiled step's trace export
    can take seconds); bundles of kit versions that opened a window per
    step carry it per step in ``steps.parquet`` ``gpu_energy_j`` instead, used where the
    phase windows are missing. ``zeus_vs_counter`` is ``zeus_energy_j / energy_j - 1`` when the
    job's energy comes from the counter and every sampled device is one rank's GPU (the same
    devices over the same span, read two ways), else None.
    """
    measured = steps.filter(pc.equal(steps["phase"], "measured"))
    if measured.num_rows == 0:
        return {"zeus_energy_j": None, "zeus_vs_counter": None}
    ranks = len(pc.unique(measured["rank"]))
    per_step = measured["gpu_energy_j"]
    if len(zeus_phase_j) == ranks and None not in zeus_phase_j:
        zeus = float(sum(e for e in zeus_phase_j if e is not None))
    elif per_step.null_count == 0:
        zeus = float(pc.sum(per_step).as_py())
    else:
        return {"zeus_energy_j": None, "zeus_vs_counter": None}
    counter = aggregate.get("energy_j") if aggregate.get("energy_source") == "counter" else None
    if counter and len(zeus_phase_j) == ranks and aggregate.get("span_energy_j"):
        counter = aggregate["span_energy_j"]  # one window around the phase: gaps included
    rel = zeus / counter - 1 if counter and devices == ranks else None
    return {"zeus_energy_j": zeus, "zeus_vs_counter": rel}


def host_power(telemetry: pa.Table, steps: pa.Table, tokens_per_step: int) -> dict[str, Any]:
    """Power and energy over the measured steps from host RAPL (``cpu_power_w``) rows.

    The fallback for hosts without GPU rows: ``power_w_mean`` is the mean over nodes of each
    node's mean package power, ``power_w_peak`` the highest sample, energy the trapezoidal
    integral of package power over each measured window, summed over windows and nodes.

    Args:
        telemetry: Rows of ``TELEMETRY_SCHEMA``; only ``source == "host"`` rows are used.
        steps: Rows of ``STEPS_SCHEMA``.
        tokens_per_step: Tokens the whole job trains per step.

    Returns:
        ``power_w_mean``, ``power_w_peak``, ``energy_j``, ``energy_source``,
        ``energy_j_per_token``, ``energy_j_per_step``; None where not measurable.
    """
    windows = step_windows(steps)
    means, peaks, energies = [], [], []
    series = _series(telemetry, windows, "host")
    measured = sampled_steps(windows, series)
    for s in series:
        power = _values(telemetry, "cpu_power_w", s.rows)
        mean, peak = _stats(power[s.measured])
        if mean is not None:
            means.append(mean)
            peaks.append(peak)
        energies.append(device_energy(windows, measured, s.t, np.full(len(s.t), np.nan),
                                      power).integral_j)
    total = sum(energies) if energies and None not in energies else None
    return {"power_w_mean": _fmean(means),
            "power_w_peak": max(peaks, default=None), "energy_j": total,
            "energy_source": "integrated cpu_power_w" if total is not None else None,
            "energy_steps": int(np.count_nonzero(measured)) if series else None,
            **_per_token(total, tokens_per_step, int(np.count_nonzero(measured)))}
